"""Speculative decoding on a K-quant GGUF target, beside the target's plain speed: the files people bring.

The targets are the default model's own weights as llama.cpp's llama-quantize writes them (--allow-requantize
from the embedded Q4_1 file: real text, not random weights): Q6_K and Q4_K_M. SmolLM2-135M's rows are 576
wide, not a multiple of a K-quant's 256-weight super-block, so llama-quantize stores most of its projections in
its fallbacks (Q8_0 in the Q6_K file, Q5_0 in the Q4_K_M one) and the rest as K-quants: the load note names the
mix, and the table's `weights` column the formats that ran. Three drafters on each target, all with the adaptive
schedule, against plain decoding in the same repeat (bench/spec.py's alternating(): every prompt under each mode
back to back, rotated prompt by prompt):

  ngram        prompt lookup at the page's k;
  self_draft   speculative.self_drafter(target): a copy of the file's weights in a cheaper format on the target's
               KV cache where that format's measured step is at most COPY_MAX_COST of the target's, else the
               target's blocks with layers skipped (the `draft` column says which, and why);
  draft_gguf   a draft model given as a GGUF of the same tokenizer (the next cheaper file: Q4_K_M for the Q6_K
               target, Q4_0 for the Q4_K_M one), on an Engine and KV cache of its own.

    python -m bench.spec_kquant [--folder /tmp/decodescope-spec-kquant] [--quick]   # -> bench/results/spec-kquant-cpu.*
    python -m bench.spec_kquant --name spec-kquant-cpu-zen4   # one CPU kind's table beside the others
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench import llamacpp
from bench.common import markdown_table, run_and_save
from bench.spec import PAGE_K, SETS, alternating, read_set, warm_up
from engine import Engine, Tokenizer, load_model, speculative
from engine.checkpoint import default_model

TARGETS = {"Q6_K": "Q4_K_M", "Q4_K_M": "Q4_0"}  # target file -> the draft model's file
FULL = dict(new_tokens=96, prompts_per_set=3, repeats=3)
QUICK = dict(new_tokens=24, prompts_per_set=1, repeats=1)


def requantized(kind: str, folder: Path) -> Path:
    """The default model's weights in `kind`, written by llama-quantize from the embedded file (made once)."""
    exe = llamacpp.quantize_binary()
    if exe is None:
        raise FileNotFoundError(f"no llama-quantize in {llamacpp.prefix() / 'bin'}: scripts/build_llamacpp.sh "
                                "builds it")
    folder.mkdir(parents=True, exist_ok=True)
    return llamacpp.requantized(exe, default_model.gguf_path(None, print), kind, folder)


def drafters(eng: Engine, draft_file: Path, cache: Path) -> list[tuple[str, str, object]]:
    """(mode, what drafts, the drafter) on one target; each drafter is kept across runs, as the page keeps it."""
    self_draft = speculative.self_drafter(eng)
    what = self_draft.chosen or f"a {self_draft.engine.model.weight_format} copy, as asked"
    draft_model = load_model(draft_file, cache_dir=cache, progress=lambda s: None)
    by_file = speculative.ModelDrafter(Engine(draft_model, eng.max_seq_len))
    return [("ngram", "lookup", None), ("self_draft", what, self_draft),
            ("draft_gguf", f"{draft_file.name} ({draft_model.weight_format}), its own cache", by_file)]


def bench(args, save) -> dict:
    grid = QUICK if args.quick else FULL
    repeats = args.repeats or grid["repeats"]
    folder, n = Path(args.folder), grid["new_tokens"]
    cache = folder / "cache"
    out = dict(grid=grid, repeats=repeats, k=PAGE_K, load_avg_start=os.getloadavg(), targets={}, rows=[])
    t0 = time.perf_counter()
    for kind, draft_kind in TARGETS.items():
        path, draft_file = requantized(kind, folder), requantized(draft_kind, folder)
        model = load_model(path, cache_dir=cache, progress=lambda s: None)
        tok = Tokenizer(model.path)
        sets = {name: [tok.encode_chat(text) for text in list(read_set(name).values())[:grid["prompts_per_set"]]]
                for name in SETS}
        eng = Engine(model, max_seq_len=max(len(p) for ps in sets.values() for p in ps) + n + 32)
        warm_up(eng, PAGE_K + 1)
        modes = drafters(eng, draft_file, cache)
        out["targets"][kind] = dict(file=path.name, file_mb=round(path.stat().st_size / 1e6, 1),
                                    weights=model.weight_format, kernels=eng.kernel_status, notes=model.load_notes)

        def run(mode, prompt, eng=eng):
            if mode is None:
                return eng.generate(prompt, n)[1]
            drafter = mode[2] or speculative.NgramDrafter()
            return speculative.generate(eng, drafter, prompt, k=PAGE_K, max_new_tokens=n)[1]

        for mode in modes:  # untimed: first calls at new shapes; a model drafter learns its draft cost
            run(mode, sets["edit"][0])
        for set_name, prompts in sets.items():
            order = list(zip(alternating([None, *modes], prompts, repeats, run), [None, *modes], strict=True))
            for tally, mode in order:
                name, what, _ = mode or ("plain", "-", None)
                row = dict(target=kind, set=set_name, mode=name, draft=what,
                           **tally.row(None if mode is None else order[0][0]))
                out["rows"].append(row)
                print(f"[{time.perf_counter() - t0:5.0f}s]", kind, set_name, name, f"{row['tok_s']:.1f} tok/s",
                      f"x{row.get('speedup', 1.0):.2f}", flush=True)
            save(out)
    out["wall_s"], out["load_avg_end"] = time.perf_counter() - t0, os.getloadavg()
    return out


def markdown(result: dict) -> str:
    g = result["grid"]
    targets = "".join(f"\n- {kind}: {t['file']} ({t['file_mb']} MB), {t['weights']} weights, {t['kernels']}; "
                      f"{' '.join(t['notes']) if isinstance(t['notes'], list) else t['notes']}"
                      for kind, t in result["targets"].items())
    return "".join([
        "Speculative decoding on K-quant GGUF targets (the default model's weights requantized by llama.cpp's "
        f"llama-quantize), the page's k={result['k']}, adaptive schedule, temperature 0; {g['new_tokens']} new "
        f"tokens per chat prompt, {g['prompts_per_set']} prompt(s) of each set of bench/data/spec-*.txt, "
        f"{result['repeats']} alternating repeat(s); load average at start / end: {result['load_avg_start']} / "
        f"{result.get('load_avg_end')}.\n{targets}\n\n"
        "speedup = decode tok/s over plain decoding's on the same target, prompts and repeat (median over repeats; "
        "lo / hi the worst and best); plain rows give the target's own speed.\n\n",
        markdown_table(result["rows"], ["target", "set", "mode", "draft", "tok_s", "speedup", "lo", "hi",
                                        "acceptance_rate", "mean_accepted_len", "plain_round_pct",
                                        "draft_overhead_pct", "tokens"]),
    ])


def main(argv=None):
    p = argparse.ArgumentParser(description="speculative decoding on K-quant GGUF targets")
    p.add_argument("--folder", default=str(Path("/tmp") / "decodescope-spec-kquant"),
                   help="where the requantized files and their model cache go")
    p.add_argument("--quick", action="store_true", help="24 tokens, one prompt per set, one repeat")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", help="the results' file name (one per CPU kind; default spec-kquant-cpu)")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name or "spec-kquant-cpu" + ("-quick" if args.quick else ""), "cpu",
                 lambda save: bench(args, save), markdown)


if __name__ == "__main__":
    main()
