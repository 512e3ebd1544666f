"""Gemma 3 270M, the second embedded model, against llama.cpp on the same GGUF file (gemma-3-270m-q4_k_m.gguf).

Correctness: for each of 3 chat-turn prompts, 64 greedy tokens from llama.cpp's Python loop on the file (f32 KV
cache, no flash attention: bench/llamacpp.py) and from ours in each CPU format (the one the loader picks, fp32 as
the exact dequantization of the file, int8 and q4 as asked for); the ids compared (identical, or the first
divergence with both engines' top-1 margins there) and our top-1 agreement teacher-forced on llama.cpp's ids
(one prefill pass over its continuation: how often our argmax names its next token).

Speed: rounds alternate ours (each format), llama.cpp's loop and llama-bench tg64, the read bandwidth measured
after every row (a row's ceiling: the larger of the two around it; this box's moves within minutes). Each row
keeps its best round; the ratio to llama.cpp is also taken round by round. The step's weight bytes are split
into the head and the rest, and the head's own time is measured on its own (the 262k-token head dominates).

    python -m bench.gemma                       # -> bench/results/gemma-cpu.{json,md}
    python -m bench.gemma --rounds 2 --formats default fp32
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
import torch

from bench import llamacpp
from bench.common import markdown_table, run_and_save
from bench.scaling import ours_decode
from bench.steps import cpu_path
from engine import Engine, Tokenizer, load_model
from engine import weights as wts
from engine.observe.bandwidth import measure_gbs

# Gemma 3's turn format. The file is the base model and carries no chat template (no tokenizer.chat_template in
# its metadata), so the turn is written out here; both engines get the same ids.
TURN = "<bos><start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"
PROMPTS = (
    "Explain in a few sentences why the sky is blue during the day and red at sunset.",
    "Write a short Python function that returns the n-th Fibonacci number, with a docstring.",
    "List three things a traveller should pack for a week of hiking in the mountains, and say why.",
)
# default: what load_model picks for the file (the app's choice). "<base>+head-<fmt>": an experiment, the base
# load with its head re-quantized to <fmt> from its own dequantized blocks (a second rounding; fewer bytes a step)
FORMATS = ("default", "fp32", "int8", "q4", "default+head-q4", "q4+head-q4")


def chat_ids(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(TURN.format(text), add_special_tokens=False)


def load(name: str, fmt: str):
    base, _, head = fmt.partition("+head-")
    model = load_model(name, weights=None if base == "default" else base, progress=lambda msg: None)
    if head:
        w = model.lm_head.weight
        model.lm_head.weight = wts.pack(wts.quantize(wts.dequantize(wts.unpack(w)), head), w.layout)
        model.use_ops(model.ops)  # the head's matmul follows its new format
        model.load_notes.append(f"head re-quantized from {w.fmt} to {head} (experiment: a second rounding)")
    return model


def gguf_split(path: Path) -> dict:
    """llama.cpp's bytes per step: every tensor once (the tied head is token_embd, read whole), head vs rest."""
    from gguf import GGUFReader

    tensors = GGUFReader(path).tensors
    head = next((t for t in tensors if t.name == "output.weight"), None) or \
        next(t for t in tensors if t.name == "token_embd.weight")
    total = sum(int(t.n_bytes) for t in tensors)
    return dict(weight_mb=total / 1e6, head_mb=int(head.n_bytes) / 1e6, head_type=head.tensor_type.name,
                head_share=int(head.n_bytes) / total)


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
def agreement(eng: Engine, prompt: list[int], theirs: list[int]) -> float:
    """Teacher-forced top-1 agreement: our argmax after each prefix of llama.cpp's ids, against its next id."""
    rows = eng.logits(prompt + theirs[:-1])[len(prompt) - 1:]
    return float((rows.argmax(-1) == torch.tensor(theirs)).float().mean())


@torch.inference_mode()
def compare(eng: Engine, prompt: list[int], theirs: dict, new_tokens: int) -> dict:
    ours, _ = eng.generate(prompt, new_tokens, temperature=0.0, stop_ids=[])
    cmp = llamacpp.compare_ids(eng, prompt, ours, theirs)
    return dict(cmp, ids_vs_llamacpp=llamacpp.ids_cell(cmp), top1_agreement=agreement(eng, prompt, theirs["ids"]),
                ours_ids=ours)


def run(args, save) -> dict:
    from engine.checkpoint import embedded

    gguf_file = embedded.gguf_path(embedded.GEMMA3_270M, progress=lambda msg: None)
    threads = torch.get_num_threads()
    models = {fmt: load(embedded.GEMMA3_270M.name, fmt) for fmt in args.formats}
    tok = Tokenizer(next(iter(models.values())).path)
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    size = max(map(len, prompts)) + args.new_tokens + 16
    engines = {fmt: Engine(m, max_seq_len=size) for fmt, m in models.items()}
    out = dict(model=f"{embedded.GEMMA3_270M.title} ({gguf_file.name})", new_tokens=args.new_tokens,
               prompts=[dict(text=p, tokens=len(ids)) for p, ids in zip(PROMPTS, prompts, strict=True)],
               threads=threads, isa=cpu_path(), rounds=args.rounds, llamacpp_info=llamacpp.describe(),
               formats={fmt: dict(loaded_as=m.format, notes=m.load_notes, **our_split(m)) for fmt, m in models.items()},
               llamacpp_split=gguf_split(gguf_file), ids=[], rows=[])

    # correctness: llama.cpp's ids once per prompt (they do not depend on our format), ours in every format
    for i, prompt in enumerate(prompts):
        theirs = llamacpp.time_decode(gguf_file, prompt, args.new_tokens, threads, repeats=1)
        for fmt, eng in engines.items():
            row = dict(prompt=i, weights=fmt, **compare(eng, prompt, theirs, args.new_tokens))
            row["llamacpp_ids"] = theirs["ids"]
            out["ids"].append(row)
            print({k: v for k, v in row.items() if not k.endswith("_ids")}, flush=True)
        save(out)

    # speed: alternating rounds on the first prompt, the bandwidth measured after every row
    ceiling = [measure_gbs("cpu")]
    timed: dict[str, list[dict]] = {}

    def add(name: str, r: dict) -> None:
        after = measure_gbs("cpu")
        timed.setdefault(name, []).append(dict(r, bandwidth_gbs=max(ceiling[-1], after)))
        ceiling.append(after)
        out["rows"], out["bandwidth_range_gbs"] = summarize(timed, out), [min(ceiling), max(ceiling)]
        save(out)  # after every row: a run cut short keeps what it measured
        print(name, {k: v for k, v in r.items() if k in ("tok_s", "tg_tok_s")}, f"{after:.0f} GB/s", flush=True)

    prompt = prompts[0]
    bench = llamacpp.bench_binary()
    for _ in range(args.rounds):
        for fmt, eng in engines.items():
            # the head alone right after the step it belongs to: the same minute's load on this shared box
            timing = ours_decode(eng, prompt, args.new_tokens)
            timing.pop("ids")  # the ids are compared above, from the greedy runs
            add(f"ours {fmt}", dict(timing, head_ms=head_ms(models[fmt])))
        loop = llamacpp.time_decode(gguf_file, prompt, args.new_tokens, threads, repeats=args.llamacpp_repeats)
        add("llama.cpp loop", dict(ms_per_token=loop["ms_per_token"], tok_s=loop["tok_s"]))
        if bench is not None:
            b = llamacpp.llama_bench(gguf_file, threads, n_gen=args.new_tokens, depth=len(prompt), n_prompt=len(prompt),
                                     repetitions=args.llamacpp_repeats)
            add("llama-bench", dict(b, tok_s=b["tg_tok_s"], ms_per_token=1e3 / b["tg_tok_s"]))
    return out


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
    head = (f"{result['model']} on CPU ({result['threads']} threads, {result['isa']}): {result['new_tokens']} greedy "
            f"tokens after each of {len(result['prompts'])} chat-turn prompts ({prompts} tokens), ours in each format "
            f"against llama.cpp's Python loop on the same file (f32 KV cache, no flash attention). ids: identical, or "
            "where they part with the top-1 margins there (ours / llama.cpp); agreement: our top-1 teacher-forced on "
            "llama.cpp's ids.\n\n")
    ids = [{k: v for k, v in r.items() if not k.endswith("_ids")} for r in result["ids"]]
    out = head + markdown_table(ids, ["prompt", "weights", "ids_vs_llamacpp", "top1_agreement"])
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
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--llamacpp-repeats", type=int, default=2, help="timed runs of llama.cpp's loop and llama-bench "
                   "per round (its spinning threads slow to a crawl on an oversubscribed box: 1 keeps a round short)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if llamacpp.unavailable():
        raise SystemExit(llamacpp.unavailable())
    run_and_save(args.out, "gemma-cpu", "cpu", lambda save: run(args, save), markdown)


if __name__ == "__main__":
    main()
