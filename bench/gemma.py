"""Gemma 3 270M, the second embedded model, against llama.cpp on the same GGUF file (gemma-3-270m-q4_k_m.gguf).

The file is the base model (no chat template in its metadata), so the prompts are text to continue: three facts
("The capital of France is", ...) and two longer openings, as ids with <bos> first, the same on both sides.

Correctness: for each prompt, 64 greedy tokens from llama.cpp on the file (llama-server with an f32 KV cache and
flash attention off, or llama-cpp-python's loop where it is installed: bench/llamacpp.py) and from ours in each
format asked for (default: the file's own blocks, as the app loads it; fp32 is the exact dequantization, int8 and
q4 a second rounding). Reported: our top-1 agreement teacher-forced on llama.cpp's ids (one prefill pass over its
continuation: how often our argmax names its next token; goal >= 99% on the file's own blocks), each position
where it does not with both sides' top-1 margins there (a near-tie both engines may break either way, or a bug),
where the free-running greedy ids first part, and the facts' completions side by side.

Where the top-1 parts, whose numerics moved: `transformers` is the model's reference implementation (transformers'
Gemma3ForCausalLM in fp32 on the file's blocks as its own GGUF loader dequantizes them), scored against llama.cpp's
ids the same way (and its logits against our fp32's, teacher-forced on those ids); `<base>+geglu-fp16` runs our
<base> with Gemma's GeGLU as llama.cpp's CPU backend computes it (the gate rounded to fp16, gelu read from a table of
fp16 values: ggml-cpu vec.h ggml_vec_geglu_f32 under GGML_GELU_FP16), everything else unchanged.

Speed (--rounds N, where llama-cpp-python or llama-bench is installed): rounds alternate ours (each format),
llama.cpp's loop and llama-bench tg64, the read bandwidth measured after every row (a row's ceiling: the larger of
the two around it). Each row keeps its best round; the ratio to llama.cpp is also taken round by round. The step's
weight bytes are split into the head and the rest, and the head's own time is measured on its own.

    python -m bench.gemma                       # -> bench/results/gemma-cpu.{json,md}
    python -m bench.gemma --rounds 0            # correctness only
    python -m bench.gemma --rounds 2 --formats default fp32
    python -m bench.gemma --rounds 0 --formats default fp32 transformers default+geglu-fp16
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
import torch

from bench import llamacpp, reference
from bench.common import markdown_table, run_and_save
from bench.scaling import ours_decode
from bench.steps import cpu_path
from engine import Engine, Tokenizer, load_model
from engine import weights as wts
from engine.observe.bandwidth import measure_gbs

# The base model continues text: facts whose completion is one well-known answer, and two longer openings
FACTS = ("The capital of France is", "Water boils at sea level at a temperature of", "The chemical symbol for gold is")
PROMPTS = (*FACTS,
           "The old lighthouse stood at the edge of the cliff. Every night its lamp turned slowly, sweeping the dark "
           "water with a long beam of light. One morning the keeper found a bottle on the rocks, and",
           'def is_prime(n: int) -> bool:\n    """Return True if n is a prime number.\n\n    >>> is_prime(7)\n')
FACT_TOKENS = 16  # a fact's completion as shown side by side
# default: what load_model picks for the file (the app's choice). "<base>+head-<fmt>": an experiment, the base
# load with its head re-quantized to <fmt> from its own dequantized blocks (a second rounding; fewer bytes a step).
# "<base>+geglu-fp16": the base with llama.cpp's GeGLU (geglu_fp16). "transformers": the model's reference
# implementation (Reference), in the correctness tables only.
FORMATS = ("default", "fp32", "int8", "q4", "default+head-q4", "q4+head-q4", "default+geglu-fp16", "transformers")
REFERENCE = "transformers"


def load(name: str, fmt: str, cache_dir=None):
    base, _, experiment = fmt.partition("+")
    model = load_model(name, weights=None if base == "default" else base, cache_dir=cache_dir,
                       progress=lambda msg: None)
    if experiment.startswith("head-"):
        head = experiment.removeprefix("head-")
        w = model.lm_head.weight
        model.lm_head.weight = wts.pack(wts.quantize(wts.dequantize(wts.unpack(w)), head), w.layout)
        model.use_ops(model.ops)  # the head's matmul follows its new format
        model.load_notes.append(f"head re-quantized from {w.fmt} to {head} (experiment: a second rounding)")
    elif experiment == "geglu-fp16":
        # the native block loop computes the gate itself: off, so each block calls the OpSet's gelu_tanh_mul
        model.use_ops(dataclasses.replace(model.ops, gelu_tanh_mul=geglu_fp16, blocks=None))
        model.load_notes.append("GeGLU as llama.cpp's CPU backend computes it (experiment: the gate rounded to fp16, "
                                "gelu from an fp16 table)")
    return model


GELU_COEF_A, SQRT_2_OVER_PI = 0.044715, 0.79788456080286535587989211986876


def geglu_fp16(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu(gate) * up as ggml-cpu computes it for f32 tensors (vec.h ggml_vec_geglu_f32 under GGML_GELU_FP16): the
    gate is rounded to fp16 and gelu's tanh form read from a table of its fp16 values (ggml_table_gelu_f16: each
    entry ggml_gelu_f32 of the fp16 input, rounded to fp16), the gate at or past +-10 taken as x or 0; the product
    with up in fp32. gate_up = [gate | up]: [N, 2I] -> [N, I]."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    x = gate.half().float()
    table = (0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))).half().float()
    gelu = torch.where(gate <= -10.0, 0.0, torch.where(gate >= 10.0, gate, table))
    y = (gelu * up).to(gate_up.dtype)
    return y if out is None else out.copy_(y)


class Reference:
    """transformers' implementation of the model on the file's blocks, dequantized to fp32 by transformers' own
    GGUF loader, behind the two calls compare() makes of an Engine: greedy ids and teacher-forced logits."""

    def __init__(self, gguf_file: Path, eos_ids: tuple[int, ...]):
        from transformers import AutoModelForCausalLM

        self.hf = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                       dtype=torch.float32).eval()
        self.model = SimpleNamespace(eos_ids=eos_ids)  # reference.agreement reads eng.model.eos_ids
        self.notes = [f"transformers {type(self.hf).__name__}, fp32, on {gguf_file.name}'s blocks dequantized by "
                      "transformers' GGUF loader (the model's reference implementation)"]

    @torch.inference_mode()
    def logits(self, ids: list[int]) -> torch.Tensor:
        return self.hf(torch.tensor([ids])).logits[0]

    @torch.inference_mode()
    def generate(self, prompt: list[int], new_tokens: int, temperature: float = 0.0, stop_ids=()):
        """Greedy ids, the end tokens held back until new_tokens (as llama-server's ignore_eos)."""
        assert temperature == 0.0 and not stop_ids, "the reference runs greedy decoding without stops only"
        out = self.hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               do_sample=False, top_k=None, top_p=None)
        return out[0, len(prompt):].tolist(), None


def gguf_split(path: Path) -> dict:
    """llama.cpp's bytes per step: every tensor once (the tied head is token_embd, read whole), head vs rest."""
    from engine.checkpoint import gguf_header

    tensors = gguf_header.read(Path(path)).tensors
    head = next((t for t in tensors if t.name == "output.weight"), None) or \
        next(t for t in tensors if t.name == "token_embd.weight")
    total = sum(t.n_bytes for t in tensors)
    return dict(weight_mb=total / 1e6, head_mb=head.n_bytes / 1e6, head_type=head.type, head_share=head.n_bytes / total)


def our_split(model) -> dict:
    head = model.lm_head.weight.nbytes
    return dict(weight_mb=model.weight_bytes / 1e6, head_mb=head / 1e6, head_type=model.lm_head.weight.fmt,
                head_share=head / model.weight_bytes)


@torch.inference_mode()
def head_ms(model, repeats: int = 20) -> float:
    """The head alone on one token's hidden state, median ms: its share of a step, measured, not inferred."""
    x = torch.randn(1, model.lm_head.in_features, dtype=next(model.parameters()).dtype)
    model.lm_head(x)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        model.lm_head(x)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def compare(eng: Engine, prompt: list[int], theirs: dict, new_tokens: int) -> dict:
    ours, _ = eng.generate(prompt, new_tokens, temperature=0.0, stop_ids=[])
    cmp = llamacpp.compare_ids(eng, prompt, ours, theirs)
    top1, splits = reference.agreement(eng, prompt, theirs)
    return dict(cmp, ids_vs_llamacpp=llamacpp.ids_cell(cmp), top1_agreement=top1, splits=splits,
                unexplained=sum(not reference.near_tie(x) for x in splits), ours_ids=ours)


def run(args, save) -> dict:
    from engine.checkpoint import embedded

    gguf_file = embedded.gguf_path(embedded.GEMMA3_270M, progress=lambda msg: None)
    threads = torch.get_num_threads()
    models = {fmt: load(embedded.GEMMA3_270M.name, fmt) for fmt in args.formats if fmt != REFERENCE}
    tok = Tokenizer(embedded.ensure(embedded.GEMMA3_270M, progress=lambda msg: None))
    prompts = [tok.encode(p) for p in PROMPTS]  # <bos> first, as llama.cpp's own tokenizer does for this file
    size = max(map(len, prompts)) + args.new_tokens + 16
    engines = {fmt: Engine(m, max_seq_len=size) for fmt, m in models.items()}
    out = dict(model=f"{embedded.GEMMA3_270M.title} ({gguf_file.name})", new_tokens=args.new_tokens,
               prompts=[dict(text=p, tokens=len(ids)) for p, ids in zip(PROMPTS, prompts, strict=True)],
               threads=threads, isa=cpu_path(), rounds=args.rounds, llamacpp_info=llamacpp.describe(),
               formats={fmt: dict(loaded_as=m.format, notes=m.load_notes, **our_split(m)) for fmt, m in models.items()},
               llamacpp_split=gguf_split(gguf_file), ids=[], facts=[], agreement={}, rows=[])
    checked = dict(engines)  # what the correctness tables score: ours, and the reference where asked for
    if REFERENCE in args.formats:
        ref = Reference(gguf_file, tuple(sorted(tok.eos_ids)))
        checked[REFERENCE] = ref
        out["formats"][REFERENCE] = dict(loaded_as="fp32", head_type="fp32", notes=ref.notes)

    # correctness: llama.cpp's ids once per prompt (they do not depend on our format), ours in every format
    with reference.reference(gguf_file, threads) as greedy:
        out["llamacpp_reference"] = "llama-server" if llamacpp.server_binary() is not None else "llama-cpp-python loop"
        for i, prompt in enumerate(prompts):
            theirs = greedy(prompt, args.new_tokens)
            for fmt, eng in checked.items():
                row = dict(prompt=i, weights=fmt, **compare(eng, prompt, theirs, args.new_tokens))
                row["llamacpp_ids"] = theirs["ids"]
                if fmt == REFERENCE and "fp32" in engines:  # how far our fp32 is from the reference, same ids
                    row["max_diff_vs_fp32"] = logit_distance(eng, engines["fp32"], prompt + theirs["ids"][:-1])
                out["ids"].append(row)
                print({k: v for k, v in row.items() if not k.endswith("_ids") and k != "splits"}, flush=True)
                if PROMPTS[i] in FACTS and fmt == args.formats[0]:
                    out["facts"].append(dict(prompt=PROMPTS[i], weights=fmt,
                                             ours=tok.decode(row["ours_ids"][:FACT_TOKENS]),
                                             llamacpp=tok.decode(theirs["ids"][:FACT_TOKENS])))
            save(out)
    for fmt in checked:
        rows = [r for r in out["ids"] if r["weights"] == fmt]
        tokens = len(rows) * args.new_tokens
        splits = sum(len(r["splits"]) for r in rows)
        out["agreement"][fmt] = dict(top1=1 - splits / tokens, tokens=tokens, splits=splits,
                                     near_ties=splits - sum(r["unexplained"] for r in rows))
    save(out)
    if args.rounds:
        timed = {fmt: eng for fmt, eng in engines.items() if not fmt.endswith("+geglu-fp16")}  # a numerics experiment
        speed(args, out, save, gguf_file, timed, models, prompts[0], threads)
    return out


@torch.inference_mode()
def logit_distance(a, b, ids: list[int]) -> float:
    """The largest |logit difference| between two implementations over every position of ids."""
    return float((a.logits(ids).float() - b.logits(ids).float()).abs().max())


def speed(args, out, save, gguf_file, engines, models, prompt, threads) -> None:
    """Alternating rounds on one prompt, the bandwidth measured after every row."""
    ceiling = [measure_gbs("cpu")]
    timed: dict[str, list[dict]] = {}

    def add(name: str, r: dict) -> None:
        after = measure_gbs("cpu")
        timed.setdefault(name, []).append(dict(r, bandwidth_gbs=max(ceiling[-1], after)))
        ceiling.append(after)
        out["rows"], out["bandwidth_range_gbs"] = summarize(timed, out), [min(ceiling), max(ceiling)]
        save(out)  # after every row: a run cut short keeps what it measured
        print(name, {k: v for k, v in r.items() if k in ("tok_s", "tg_tok_s")}, f"{after:.0f} GB/s", flush=True)

    bench = llamacpp.bench_binary()
    for _ in range(args.rounds):
        for fmt, eng in engines.items():
            # the head alone right after the step it belongs to: the same minute's load on this shared box
            timing = ours_decode(eng, prompt, args.new_tokens)
            timing.pop("ids")  # the ids are compared above, from the greedy runs
            add(f"ours {fmt}", dict(timing, head_ms=head_ms(models[fmt])))
        if llamacpp.unavailable() is None:
            loop = llamacpp.time_decode(gguf_file, prompt, args.new_tokens, threads, repeats=args.llamacpp_repeats)
            add("llama.cpp loop", dict(ms_per_token=loop["ms_per_token"], tok_s=loop["tok_s"]))
        if bench is not None:
            b = llamacpp.llama_bench(gguf_file, threads, n_gen=args.new_tokens, depth=len(prompt), n_prompt=len(prompt),
                                     repetitions=args.llamacpp_repeats)
            add("llama-bench", dict(b, tok_s=b["tg_tok_s"], ms_per_token=1e3 / b["tg_tok_s"]))


def summarize(timed: dict[str, list[dict]], out: dict) -> list[dict]:
    """One row per engine: its best round, every round's tok/s, and the ratio to llama.cpp's loop and to
    llama-bench taken round by round (the median: a pair timed in the same minutes) and best over best."""
    rows = []
    for name, runs in timed.items():
        best = max(runs, key=lambda r: r["tok_s"])
        fmt = name.removeprefix("ours ")
        split = out["formats"][fmt] if name.startswith("ours") else out["llamacpp_split"]
        mb = split["weight_mb"]
        row = dict(engine=name, tok_s=best["tok_s"], ms_per_token=best["ms_per_token"],
                   rounds_tok_s=[round(r["tok_s"], 1) for r in runs], weight_mb=mb, head_mb=split["head_mb"],
                   head_type=split["head_type"], head_share=split["head_share"], gb_s=mb / best["ms_per_token"],
                   bandwidth_gbs=best["bandwidth_gbs"],
                   pct_of_ceiling=100 * mb / best["ms_per_token"] / best["bandwidth_gbs"])
        for anchor in ("llama.cpp loop", "llama-bench"):
            if anchor in timed and name != anchor:
                ratios = [a["tok_s"] / b["tok_s"] for a, b in zip(runs, timed[anchor], strict=False)]
                key = f"over_{anchor.split()[0].replace('.', '').replace('-', '_')}"
                row[key] = statistics.median(ratios)
                row[f"best_{key}"] = best["tok_s"] / max(r["tok_s"] for r in timed[anchor])
        if name.startswith("ours"):
            row["head_ms"] = best["head_ms"]
            row["head_time_share"] = best["head_ms"] / best["ms_per_token"]
        if name == "llama-bench":
            row.update({k: best[k] for k in ("tg_test", "tg_stddev", "pp_test", "pp_tok_s", "type_k")})
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    bw = result.get("bandwidth_range_gbs", ["?", "?"])
    prompts = ", ".join(f"{p['tokens']}" for p in result["prompts"])
    ref = result.get("llamacpp_reference", "llama-cpp-python loop")
    head = (f"{result['model']} on CPU ({result['threads']} threads, {result['isa']}): {result['new_tokens']} greedy "
            f"tokens after each of {len(result['prompts'])} prompts to continue ({prompts} tokens; the file is the "
            f"base model), ours in each format against llama.cpp ({ref}) on the same file (f32 KV cache, no flash "
            "attention). ids: identical, or where the free-running ids part with the top-1 margins there (ours / "
            "llama.cpp); agreement: our top-1 teacher-forced on llama.cpp's ids; unexplained: the positions where "
            f"it differs and both sides' top-1 margins are {reference.NEAR_TIE:g} logit or more (not a near-tie).\n\n")
    ids = [{k: v for k, v in r.items() if not k.endswith("_ids")} for r in result["ids"]]
    cols = ["prompt", "weights", "ids_vs_llamacpp", "top1_agreement", "unexplained"]
    if any("max_diff_vs_fp32" in r for r in ids):
        head += (f"max_diff_vs_fp32: the largest |logit difference| between the reference ({REFERENCE}) and our fp32, "
                 "teacher-forced over the prompt and llama.cpp's ids.\n\n")
        cols.append("max_diff_vs_fp32")
    out = head + markdown_table(ids, cols)
    if result.get("agreement"):
        out += "\nTeacher-forced top-1 agreement over every prompt:\n\n"
        out += markdown_table([dict(weights=f, **a) for f, a in result["agreement"].items()],
                              ["weights", "top1", "tokens", "splits", "near_ties"])
        splits = [dict(prompt=r["prompt"], weights=r["weights"], **x) for r in result["ids"] for x in r["splits"]]
        if splits:
            out += "\nWhere the top-1 differs (ids, and each side's top-1 margin in logits there):\n\n"
            out += markdown_table(splits, ["prompt", "weights", "at", "ours", "theirs", "our_margin",
                                           "llamacpp_margin"])
    if result.get("facts"):
        out += f"\nThe facts' greedy completions ({FACT_TOKENS} tokens), side by side:\n\n"
        out += markdown_table([dict(f, ours=repr(f["ours"]), llamacpp=repr(f["llamacpp"])) for f in result["facts"]],
                              ["prompt", "weights", "ours", "llamacpp"])
    out += "\nFormats as loaded (what the loader did to the file's blocks):\n\n"
    for fmt, f in result["formats"].items():
        notes = "; ".join(n.removeprefix("decodescope: ") for n in f["notes"]) or "no notes"
        out += f"- {fmt} -> {f['loaded_as']}, head {f['head_type']}: {notes}\n"
    if result["rows"]:
        out += (f"\nDecode speed on the first prompt, {result['rounds']} alternating rounds, each row's best (the "
                f"read bandwidth moved within {bw[0]:.0f}-{bw[1]:.0f} GB/s; a row's ceiling is the larger of the two "
                "measured around it). over_llamacpp / over_llama_bench: the median of the per-round ratios. "
                "head_share: the head's bytes over the step's; head_time_share: the head alone, timed, over the "
                "step. llama-bench: tg at the prompt's depth, f16 KV cache, flash attention auto, as it ships.\n\n")
        out += markdown_table(result["rows"], ["engine", "tok_s", "rounds_tok_s", "ms_per_token", "over_llamacpp",
                                               "over_llama_bench", "best_over_llamacpp", "best_over_llama_bench",
                                               "weight_mb", "head_type", "head_mb", "head_share",
                                               "head_ms", "head_time_share", "gb_s", "bandwidth_gbs", "pct_of_ceiling"])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="Gemma 3 270M against llama.cpp on the same GGUF file")
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS,
                   help="the first is the one whose facts are shown side by side (default: the file's own blocks)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--llamacpp-repeats", type=int, default=2, help="timed runs of llama.cpp's loop and llama-bench "
                   "per round (its spinning threads slow to a crawl on an oversubscribed box: 1 keeps a round short)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if reference.reference_missing():
        raise SystemExit(reference.reference_missing())
    if REFERENCE in args.formats and importlib.util.find_spec("transformers") is None:
        raise SystemExit("--formats transformers scores the model's reference implementation, which needs the "
                         "transformers package: pip install transformers, or leave that format out")
    run_and_save(args.out, "gemma-cpu", "cpu", lambda save: run(args, save), markdown)


if __name__ == "__main__":
    main()
