"""What one token's pick costs on the CPU: the draw (argmax at temperature 0; at T > 0 the sampling distribution
and the exponential race against a new position's noise row) and the probability the token is shown with,
through Engine.pick, per vocabulary size and path, the paths alternating round by round.

    python -m bench.pick [--vocab 49152 151936 262144] [--repeats 5] [--picks 40] [--name pick-cpu]

Settings: greedy; temperature 0.7 alone; with top-p 0.9; with top-k 40.

Paths: `kernels`, the CPU module's greedy (the argmax, the max and logsumexp in one pass: the shown probability is
exp(max - logsumexp); a model's head makes them as it writes its logits, which this bench does not time), softmax (the
sampling distribution at T > 0, the temperature in the same pass; under top-p or top-k, nucleus: the mask found
without sorting the row), exp_noise (a noise row: hashed uniforms, -log) and race (the draw: the argmax of the
distribution over the noise); `twins`, the same recipe in torch (engine/ops/ref.py); `torch`, a pick as
Engine.pick made it before those kernels: the whole softmax of the row for a greedy token's shown probability,
torch's softmax of logits / temperature (under top-p or top-k, after the twin's mask), noise rows from torch's
generator (torch.rand, then -log) and the race in torch. Every pick takes a position never drawn before, so at
T > 0 each makes its noise row, as a plain decode step does. us: microseconds a pick, the median over the repeats
of each round's mean over `picks` picks; vs_torch: the torch path's over this one's, round by round (median).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.common import alternation, markdown_table, run_and_save
from engine.engine import Engine
from engine.ops import ext, ref
from engine.ops.cpu import CpuOps
from engine.sampling import Noise, SamplingParams, sample

SETTINGS = ((0.0, 1.0, 0), (0.7, 1.0, 0), (0.7, 0.9, 0), (0.7, 1.0, 40))  # (temperature, top_p, top_k)
VOCABS = {49152: "SmolLM2", 151936: "Qwen2.5", 262144: "Gemma 3"}


def torch_noise(out: torch.Tensor, key: int) -> torch.Tensor:
    """A noise row from torch's generator (mt19937 seeded with the key): -log of its uniforms."""
    return out.copy_(torch.rand(out.shape[0], generator=torch.Generator().manual_seed(key)).log_().neg_())


def torch_pick(logits: torch.Tensor, sampling: SamplingParams, noise: Noise) -> tuple[int, float]:
    """A pick as Engine.pick made it before the kernels: the draw (torch's softmax of logits / temperature), then
    the whole softmax of the row for the shown probability when greedy (the sampling distribution otherwise),
    read at the token."""
    tok, dist = sample(logits[None], sampling, noise, ref.softmax)
    shown = (logits[None].float().softmax(-1) if sampling.greedy else dist)[0]
    tok_id = int(tok[0])
    return tok_id, float(shown[tok_id])


def paths() -> dict[str, tuple]:
    """path -> (pick(logits, sampling, noise), its noise's exp_noise and race): Engine.pick with the kernels' or
    the twins' greedy and softmax, or the pick before them; without a race kernel the noise races over its rows
    in torch (engine/sampling.py draw)."""
    def engine_pick(ops):
        eng = SimpleNamespace(model=SimpleNamespace(ops=ops, head_picks=None))
        eng.greedy = lambda logits: Engine.greedy(eng, logits)
        return lambda logits, sampling, noise: Engine.pick(eng, logits, sampling, noise)

    module = ext.load("cpu").module
    ops = None if module is None else CpuOps(module)
    kernels = {} if ops is None else {"kernels": (engine_pick(ops), SimpleNamespace(fill=ops.exp_noise,
                                                                                     race=ops.race))}
    return {**kernels, "twins": (engine_pick(ref), SimpleNamespace(fill=ref.exp_noise, race=None)),
            "torch": (torch_pick, SimpleNamespace(fill=torch_noise, race=None))}


def noise(ops, seed: int) -> Noise:
    """A run's noise through a path's exp_noise and race."""
    return Noise(seed, "cpu", ops.fill, ops.race)


def pick_us(path: tuple, logits: torch.Tensor, sampling: SamplingParams, picks: int, first: int) -> float:
    """Mean microseconds of a path's pick over `picks` positions from `first`."""
    pick, ops = path
    gen = noise(ops, 1)
    t = time.perf_counter()
    for pos in range(first, first + picks):
        pick(logits, sampling, gen.at(pos))
    return (time.perf_counter() - t) / picks * 1e6


def run(args, save) -> dict:
    modes = paths()
    names = list(modes)
    result = dict(vocab=args.vocab, repeats=args.repeats, picks=args.picks, rows=[])
    for V in args.vocab:
        logits = torch.randn(V, generator=torch.Generator().manual_seed(V)) * 4  # a spread like real logits'
        for temperature, top_p, top_k in SETTINGS:
            sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=1)
            us = {name: [] for name in names}
            for name in names:  # warm: first calls, allocations
                pick_us(modes[name], logits, sampling, 3, 10**6)
            for rep, _, m in alternation(len(names), 1, args.repeats):
                us[names[m]].append(pick_us(modes[names[m]], logits, sampling, args.picks, rep * args.picks))
            for name in names:
                vs = [t / o for t, o in zip(us["torch"], us[name], strict=True)]
                result["rows"].append(dict(vocab=V, like=VOCABS.get(V, ""), temperature=temperature, top_p=top_p,
                                           top_k=top_k, path=name, us=statistics.median(us[name]),
                                           vs_torch=statistics.median(vs), rounds_us=us[name]))
            save(result)
    return result


def markdown(result: dict) -> str:
    p = result.get("provenance", {})
    tel = p.get("telemetry") or {}
    head = (f"One token's pick through Engine.pick on the CPU ({tel.get('cpu_model', p.get('cpu', ''))}, "
            f"{p.get('torch_threads', '?')} threads), {result['picks']} new positions a round, "
            f"{result['repeats']} alternating rounds (medians). "
            + " ".join(__doc__.split("\n\n")[2:4]).replace("\n", " "))
    return head + "\n\n" + markdown_table(result["rows"], ["vocab", "like", "temperature", "top_p", "top_k", "path",
                                                           "us", "vs_torch"]) + "\n"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, nargs="+", default=list(VOCABS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--picks", type=int, default=40)
    p.add_argument("--name", default="pick-cpu")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    run_and_save(args.out, args.name, "cpu", lambda save: run(args, save), markdown)


if __name__ == "__main__":
    main()
