"""Speculative decoding vs plain decoding on the default model, as ratios measured within one run.

Three prompt sets (prose; code; quote-or-edit, where the answer repeats its input), temperature 0 and 0.7,
plain decoding against each drafter at several k, after a layer-skip depth sweep that picks the depth
used in the grid. Speedup = decode tok/s of the mode / decode tok/s of plain decoding on the same prompts
at the same temperature, both from this run (decode tok/s excludes the first token, as Stats does).

    python -m bench.spec --device cpu [--out bench/results] [--quick]

Draft model: no second model with SmolLM2's vocabulary is available offline, so the draft model is the
default model itself on its own engine and cache. That bounds acceptance from above (it always agrees)
and speed from below (each draft costs a full decode step): a real draft model sits in between.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import Telemetry, markdown_table, provenance, write_results
from bench.steps import prompt_ids, shape_config, verify_costs
from engine import Engine, Tokenizer, graphs, load_model, speculative
from engine.loader import random_model
import torch

PASSAGE = ("The old lighthouse stood at the edge of the cliff for more than a century. Every night its keeper "
           "climbed the narrow stairs, trimmed the wick and watched the beam sweep across the dark water, "
           "warning ships away from the rocks below.")
PROMPTS = {
    "prose": ["Write a short paragraph about why the sky is blue.",
              "Describe a quiet morning in a small mountain village."],
    "code": ["Write a Python function that returns the n-th Fibonacci number, with a docstring.",
             "Write a Python function that checks whether a string is a palindrome."],
    "quote": ["Repeat the following text exactly, word for word:\n\n" + PASSAGE,
              "Fix the spelling mistakes in this text and return the corrected text only:\n\n"
              "The old lighthuose stood at the edge of the clif for more then a century. Every nihgt its keeper "
              "climbed the narow stairs, trimed the wick and watched the beam sweep across the dark watter."],
}
# per-mode k lists: layer-skip and the self-drafting model cost most of a decode step per draft, so their
# grids are smaller; sized from --quick timings to keep the full CPU run under ~15 minutes on 2 quiet cores
FULL = dict(new_tokens=64, prompts_per_set=2, temperatures=[0.0, 0.7], depths=[8, 16, 24, 28], sweep_k=3,
            ks=dict(ngram=[2, 3, 5, 8], layer_skip=[2, 3, 5], draft_model=[3]))
QUICK = dict(new_tokens=24, prompts_per_set=1, temperatures=[0.0], depths=[16, 28], sweep_k=3,
             ks=dict(ngram=[3], layer_skip=[3], draft_model=[3]))


def encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode_chat(text) if tok.chat_template else tok.encode(text)


def warm_up(eng: Engine, max_t: int) -> None:
    """First calls at a new shape pick kernels (oneDNN, MKL); keep that out of the timed runs."""
    with torch.inference_mode():
        eng.prefill(list(range(100, 132)))
        for t in range(1, max_t + 1):
            eng.chunk(torch.full((1, t), 100, device=eng.device))
            eng.rollback(32)


def measure(run, prompts: list[list[int]]) -> dict:
    """run(prompt) -> Stats for each prompt; decode figures pooled over the prompts."""
    tokens = decode_ms = drafted = accepted = spec_rounds = spec_emitted = draft_ms = spec_ms = 0
    for prompt in prompts:
        s = run(prompt)
        rounds = s.rounds
        tokens += len(s.ids) - 1
        decode_ms += rounds[-1].t_end_ms - rounds[0].t_end_ms
        spec = [r for r in rounds if r.n_drafted]
        drafted += sum(r.n_drafted for r in spec)
        accepted += sum(r.n_accepted for r in spec)
        spec_rounds += len(spec)
        spec_emitted += sum(len(r.emitted) for r in spec)
        draft_ms += sum(r.draft_ms for r in rounds[1:])
        spec_ms += sum(r.total_ms for r in rounds[1:])
    nan = float("nan")
    return dict(tokens=tokens, tok_s=1e3 * tokens / decode_ms if decode_ms else nan,
                acceptance_rate=accepted / drafted if drafted else nan,
                mean_accepted_len=spec_emitted / spec_rounds if spec_rounds else nan,
                draft_overhead_pct=100 * draft_ms / spec_ms if spec_ms else nan)


def bench(args) -> dict:
    grid = QUICK if args.quick else FULL
    model = load_model(None, device=args.device)
    tok = Tokenizer(model.path)
    sets = {name: [encode(tok, p) for p in texts[: grid["prompts_per_set"]]] for name, texts in PROMPTS.items()}
    longest = max(len(p) for ps in sets.values() for p in ps)
    eng = Engine(model, max_seq_len=longest + grid["new_tokens"] + 32)
    self_draft = speculative.ModelDrafter(Engine(model, eng.max_seq_len))
    if args.device == "cuda":  # layer-skip drafters follow the target's graphs by themselves
        graphs.enable(eng)
        graphs.enable(self_draft.engine)
    warm_up(eng, max(max(ks) for ks in grid["ks"].values()) + 1)
    n, first = grid["new_tokens"], sets["prose"][0]

    def plain(temperature):
        return lambda p: eng.generate(p, n, temperature=temperature)[1]

    primed = set()

    def spec(drafter, k, temperature):
        # an untimed short run first: the drafter's first calls (and graph captures on CUDA) stay out
        if (id(drafter), k) not in primed:
            speculative.generate(eng, drafter, first, k=k, max_new_tokens=2 * k + 2)
            primed.add((id(drafter), k))
        return lambda p: speculative.generate(eng, drafter, p, k=k, max_new_tokens=n, temperature=temperature)[1]

    rows, t_start = [], time.perf_counter()

    def add(set_name, temperature, mode, k, draft, result, base):
        row = dict(set=set_name, temperature=temperature, mode=mode, k=k, draft=draft, **result)
        row["speedup"] = result["tok_s"] / base["tok_s"] if base else 1.0
        rows.append(row)
        print(f"[{time.perf_counter() - t_start:6.0f}s] " + " ".join(
            f"{key}={val:.3g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()), flush=True)

    # layer-skip depth sweep at temperature 0 on each set's first prompt; the best mean speedup picks the depth
    sweep = {}
    for set_name, prompts in sets.items():
        base = measure(plain(0.0), prompts[:1])
        add(set_name, 0.0, "plain", None, "-", base, None)
        for depth in grid["depths"]:
            drafter = speculative.LayerSkipDrafter(eng, n_layers=depth)
            add(set_name, 0.0, "layer_skip_sweep", grid["sweep_k"], f"first {depth} layers",
                measure(spec(drafter, grid["sweep_k"], 0.0), prompts[:1]), base)
            sweep.setdefault(depth, []).append(rows[-1]["speedup"])
    best = max(sweep, key=lambda d: sum(sweep[d]) / len(sweep[d]))
    drafters = [("ngram", speculative.NgramDrafter(max_n=3), "prompt lookup, n=3..1"),
                ("layer_skip", speculative.LayerSkipDrafter(eng, n_layers=best),
                 f"first {best} of {model.config.n_layers} layers"),
                ("draft_model", self_draft, "the default model itself (upper bound)")]
    for temperature in grid["temperatures"]:
        for set_name, prompts in sets.items():
            base = measure(plain(temperature), prompts)
            add(set_name, temperature, "plain", None, "-", base, None)
            for mode, drafter, what in drafters:
                for k in grid["ks"][mode]:
                    add(set_name, temperature, mode, k, what, measure(spec(drafter, k, temperature), prompts), base)
    return dict(model=f"SmolLM2-135M-Instruct (embedded default), {model.dtype}", device=args.device,
                threads=torch.get_num_threads(), grid=grid, best_layer_skip_depth=best,
                sweep_mean_speedup={d: sum(v) / len(v) for d, v in sweep.items()}, rows=rows,
                wall_s=time.perf_counter() - t_start, kernels=eng.kernel_status, graphs=eng.graph_status)


def cuda_bench(args, save) -> dict:
    """On a GPU machine (offline: no model to load) what needs no real text: a verify pass of k + 1 tokens
    against one decode step, eager and graphed, on random weights of TinyLlama's shape."""
    model = random_model(shape_config("tinyllama"), "cuda", torch.bfloat16)
    prompt = prompt_ids(model.config.vocab_size, 128)
    out = dict(device="cuda", model="random weights, TinyLlama-1.1B shape, bf16", kernels=model.ops.reason, rows=[])
    for use_graph in (False, True):
        eng = Engine(model, max_seq_len=512)
        eng.use_graphs(use_graph)
        out["rows"].append(dict(graph=eng.graph is not None, **verify_costs(eng, prompt, ts=range(1, 10))))
        save(out)
    return out


def markdown(result: dict) -> str:
    if result["device"] == "cuda":
        cols = ["graph", "step_ms"] + [f"verify{T}_over_step" for T in range(1, 10)]
        return (f"Verify pass of T tokens over one decode step on CUDA, {result['model']} "
                f"({result['kernels']}).\n\n" + markdown_table(result["rows"], cols))
    g = result["grid"]
    head = (f"Speculative decoding on {result['device']} ({result['threads']} threads), {result['model']}, "
            f"{g['new_tokens']} new tokens, {g['prompts_per_set']} chat prompt(s) per set; speedup = decode tok/s "
            "over plain decoding's on the same prompts and temperature in this run. Layer-skip depth "
            f"{result['best_layer_skip_depth']} was the best of the sweep over {g['depths']} (k={g['sweep_k']}, "
            "each set's first prompt). "
            "The draft model is the default model drafting for itself: acceptance is an upper bound and "
            "speed a lower bound (no smaller model shares its vocabulary offline).\n\n")
    cols = ["set", "temperature", "mode", "k", "draft", "tok_s", "speedup", "acceptance_rate",
            "mean_accepted_len", "draft_overhead_pct", "tokens"]
    return head + markdown_table(result["rows"], cols)


def main(argv=None):
    p = argparse.ArgumentParser(description="speculative decoding benchmark")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="24 tokens, one prompt per set, k=3, temperature 0, two depths")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run with --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    with Telemetry(args.device) as tel:
        def save(result):
            result["provenance"] = provenance(args.device, tel)
            write_results(args.out, f"spec-{args.device}" + ("-quick" if args.quick else ""), result,
                          markdown(result))

        result = cuda_bench(args, save) if args.device == "cuda" else bench(args)
    save(result)
    print(markdown(result))


if __name__ == "__main__":
    main()
