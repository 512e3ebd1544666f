"""Time to the first token on the default model: a calibrated layer-skip run, whose calibration over a prompt of
at most 64 tokens makes the target's prefill too, against the same drafter with that sharing off (the calibration,
then the target's own prefill), and plain decoding; the three taking turns prompt by prompt (bench.common's
alternation) over bench.spec_open's open prompts, each run's round 0 end (Stats.summary's ttft_ms).

    python -m bench.first_token --name first-token-cpu-zen4
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import engine  # noqa: F401  (before torch: the OpenMP settings)
from bench.common import alternation, markdown_table, run_and_save
from bench.spec_open import open_prompts
from engine import Engine, Tokenizer, load_model, speculative

COLS = ["mode", "ttft_ms", "lo", "hi", "over_shared", "runs", "prompt_tokens"]


def bench(args, save) -> dict:
    model = load_model(None, device="cpu", progress=lambda s: None)
    tok = Tokenizer(model.path)
    prompts = [tok.encode_chat(t) for t in open_prompts(tok, args.prompts)]
    eng = Engine(model, max_seq_len=max(map(len, prompts)) + 8)
    shared, separate = speculative.LayerSkipDrafter(eng), speculative.LayerSkipDrafter(eng)
    separate.shares_prefill = False
    modes = {"plain": None, "layer_skip": shared, "layer_skip_two_prefills": separate}
    names = list(modes)
    ttft = {name: [] for name in names}
    prefilled = {name: set() for name in names}
    for _, i, m in alternation(len(names), len(prompts), args.repeats + 1):  # the first repeat warms up, untimed
        name, drafter = names[m], modes[names[m]]
        if drafter is None:
            stats = eng.generate(prompts[i], 2, stop_ids=[])[1]
        else:
            stats = speculative.generate(eng, drafter, prompts[i], max_new_tokens=2, stop_ids=[])[1]
            prefilled[name].add(stats.drafter_info.get("calibration_prefilled"))
        ttft[name].append(stats.summary()["ttft_ms"])
    n, lengths = len(prompts), sorted(map(len, prompts))
    shared_ms, rows = ttft["layer_skip"][n:], []
    for name in names:
        timed = ttft[name][n:]  # each mode ran the same (repeat, prompt) pairs in the same order
        rows.append(dict(mode=name, ttft_ms=statistics.median(timed), lo=min(timed), hi=max(timed), runs=len(timed),
                         prompt_tokens=f"{lengths[0]}-{lengths[-1]}",
                         over_shared=statistics.median(a / b for a, b in zip(timed, shared_ms, strict=True))))
    return dict(model=f"SmolLM2-135M-Instruct (embedded default), {model.weight_format}", kernels=eng.kernel_status,
                repeats=args.repeats, rows=rows,
                calibration_prefilled={k: sorted(map(str, v)) for k, v in prefilled.items() if v})


def markdown(result: dict) -> str:
    return (f"Time to the first token, {result['model']} ({result['kernels']}), {result['repeats']} repeat(s) of the "
            "open prompts, the modes taking turns prompt by prompt; medians (lo / hi: the extremes). over_shared: "
            "the median over runs of the mode's TTFT over layer skip's (calibration and prefill shared) on the same "
            f"prompt in the same repeat. calibration_prefilled: {result['calibration_prefilled']}.\n\n"
            + markdown_table(result["rows"], COLS))


def main(argv=None):
    p = argparse.ArgumentParser(description="time to the first token: layer skip's calibration sharing the prefill")
    p.add_argument("--prompts", type=int, default=12, help="bench.spec_open's open prompts (38-44 tokens)")
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="first-token-cpu", help="the results' file name (one per CPU kind)")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: bench(args, save), markdown)


if __name__ == "__main__":
    main()
