"""A decode step's time after other work: what a plain round inside a speculative run pays that plain decoding's
back-to-back steps do not.

Before each timed step runs one prelude: another decode step (plain decoding's case, the baseline), a verify pass
of T positions rolled back (a round that drafted), the n-gram drafter's share of a plain round (its commit of the
last token and its lookup, what an n-gram run does between two plain steps), an idle pause, the same time spent
busy (a spin that touches no memory: where it costs what the pause does, the time since the weights were read is
what counts, not an idle core waking), or a read of a buffer twice the last-level cache's size (the caches
flushed). A step of the default model reads ~100 MB of weights; on a machine whose last-level cache is shared with
other work and about that size or larger, part of them can still be there from the step before, and whatever runs
in between (a slower pass, a pause, others' jobs) lets them age out.
The preludes rotate within each round, every step runs after a fresh prefill of the same prompt, and over_step is
the median over rounds of a prelude's median step over the same round's baseline. With --then N, N steps are
timed one after another behind each prelude (each rolled back to the prompt), and a row per prelude and step
shows how long what the prelude did stays in the steps after it.

    python -m bench.step_after [--weights q4_a8] [--ts 6 17] [--pause-ms 3] [--then 1] [--rounds 5]
                               [--name step-after-cpu-<kind>]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import markdown_table, run_and_save
from bench.steps import TEXT, cpu_path
from engine import Engine, Tokenizer, load_model
from engine.speculative import NgramDrafter
from engine.observe.bandwidth import measure_gbs
import torch


def llc_bytes(default: int = 256 << 20) -> int:
    """The last-level cache's size as the kernel reports it (cpu0's highest cache index), else `default`."""
    sizes = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes) if sizes else default


def preludes(ts: list[int], pause_ms: float, flush_bytes: int) -> list[tuple[str, str, float]]:
    """(name, kind, argument) of each prelude, the baseline first."""
    return ([("after a step", "step", 0)] + [(f"after a verify pass of {T}", "verify", T) for T in ts]
            + [("after the n-gram commit and lookup", "lookup", 0), (f"after {pause_ms:g} ms idle", "pause", pause_ms),
               (f"after {pause_ms:g} ms busy", "busy", pause_ms),
               (f"after reading {flush_bytes >> 20} MB", "flush", flush_bytes)])


@torch.inference_mode()
def steps_after(eng: Engine, prompt: list[int], kind: str, arg: float, steps: int, flush: torch.Tensor | None,
                warmup: int = 3, then: int = 1) -> list[list[float]]:
    """ms of `steps` decode steps after their preludes, on top of the prompt's prefill: [the first step after each
    prelude, ..., the then-th step after it]. The cache is rolled back to the prompt after each step, so every
    step attends to the same length."""
    eng.prefill(prompt)
    base, token = len(prompt), torch.tensor([prompt[-1]], device=eng.device)
    drafter = NgramDrafter()
    drafter.begin(eng, prompt)
    times: list[list[float]] = [[] for _ in range(then)]
    for i in range(warmup + steps):
        if kind == "step":
            eng.decode(token)
            eng.rollback(base)
        elif kind == "verify":
            eng.chunk(torch.tensor([prompt[:int(arg)]], device=eng.device))
            eng.rollback(base)
        elif kind == "lookup":  # the drafter's tokens grow by one a round, as in a run
            drafter.commit(0, [prompt[i % len(prompt)]])
            drafter.context()
        elif kind == "pause":
            time.sleep(arg / 1e3)
        elif kind == "busy":
            until = time.perf_counter() + arg / 1e3
            while time.perf_counter() < until:
                pass
        elif kind == "flush":
            flush.add_(1)  # every line read and written
        for d in range(then):
            t = time.perf_counter()
            eng.decode(token)
            ms = (time.perf_counter() - t) * 1e3
            eng.rollback(base)
            if i >= warmup:
                times[d].append(ms)
    return times


def label(name: str, d: int, then: int) -> str:
    """A row's prelude: its name, and with more than one step timed after it, which one."""
    return name if then == 1 else f"{name}, step {d + 1}"


def summarize(names: list[str], rounds: list[dict[str, float]]) -> list[dict]:
    """Per prelude: its median step over the rounds, and the median, least and most of its ratio to the same
    round's baseline (the first name)."""
    rows = []
    for name in names:
        ratios = [r[name] / r[names[0]] for r in rounds]
        rows.append(dict(prelude=name, step_ms=statistics.median(r[name] for r in rounds),
                         over_step=statistics.median(ratios), lo=min(ratios), hi=max(ratios)))
    return rows


def bench(args, save) -> dict:
    model = load_model(None, weights=args.weights, progress=lambda msg: None)
    prompt = Tokenizer(model.path).encode(TEXT.read_text())[:args.prompt_len]
    eng = Engine(model, max_seq_len=args.prompt_len + max(args.ts) + 8)
    flush_bytes = 2 * llc_bytes()
    flush = torch.zeros(flush_bytes // 4)
    kinds = preludes(args.ts, args.pause_ms, flush_bytes)
    names = [label(name, d, args.then) for name, _, _ in kinds for d in range(args.then)]
    out = dict(model="SmolLM2-135M-Instruct (embedded default)", weights=model.weight_format,
               isa=cpu_path(), weight_bytes=model.weight_bytes, llc_bytes=flush_bytes // 2, steps=args.steps,
               then=args.then,
               prompt_len=len(prompt), rounds=[], read_gb_s=[], rows=[])
    for r in range(args.rounds):
        out["read_gb_s"].append(measure_gbs("cpu"))
        medians = {}
        for j in range(len(kinds)):  # the order rotates one place a round, so no prelude always follows another
            name, kind, arg = kinds[(j + r) % len(kinds)]
            for d, times in enumerate(steps_after(eng, prompt, kind, arg, args.steps, flush, then=args.then)):
                medians[label(name, d, args.then)] = statistics.median(times)
        out["rounds"].append(medians)
        out["rows"] = summarize(names, out["rounds"])
        print(r, {k: round(v, 2) for k, v in medians.items()}, flush=True)
        save(out)
    return out


def markdown(result: dict) -> str:
    gbs = result["read_gb_s"]
    return (f"A decode step of {result['model']} ({result['weights']}, {result['weight_bytes'] / 1e6:.0f} MB of "
            f"weights; {result['isa']}) timed right after each prelude, {result['prompt_len']}-token prompt, "
            f"{result['steps']} preludes a round, each followed by {result.get('then', 1)} timed step(s) (step d: "
            f"the d-th after it), {len(result['rounds'])} rounds, the preludes' order "
            f"rotating; last-level cache {result['llc_bytes'] >> 20} MB as the kernel reports it; read bandwidth "
            f"{min(gbs):.1f}-{max(gbs):.1f} GB/s. over_step: the median over rounds of the prelude's median step "
            f"over the same round's step after a step (lo / hi: the least and most).\n\n"
            + markdown_table(result["rows"], ["prelude", "step_ms", "over_step", "lo", "hi"]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", default="q4_a8")
    p.add_argument("--ts", type=int, nargs="+", default=[6, 17], help="verify pass sizes")
    p.add_argument("--pause-ms", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=24, help="preludes a round")
    p.add_argument("--then", type=int, default=1, help="steps timed in a row after each prelude")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="step-after-cpu")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: bench(args, save), markdown)


if __name__ == "__main__":
    main()
