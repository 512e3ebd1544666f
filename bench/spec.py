"""Speculative decoding vs plain decoding on the default model, as ratios measured within one run.

Three prompt sets (prose; code; quote-or-edit, where the answer repeats its input), temperature 0 and 0.7.
Every mode runs with the adaptive schedule (engine/speculative/schedule.py; k is the most a round drafts) except the
fixed-k rows kept for reference. Each repeat runs plain decoding and every mode back to back on every prompt
of a set, so the modes share the machine's load; speedup = a mode's decode tok/s over plain's, pooled over the
prompts and repeats (lo / hi: the worst and best repeat). Decode tok/s excludes the first token (as Stats does).

Then the tables that say why: a verify pass of T positions over one decode step (bench.steps), each drafter's
draft cost and acceptance by position at a fixed k (what the schedule weighs), the layer-skip sweep (the first
N layers against the calibrated set), and what the schedule's formula predicts at the weight-format kernels'
target costs from the acceptance measured here.

    python -m bench.spec --device cpu [--out bench/results] [--quick] [--repeats 3]

Quantized self-drafting is the default model drafting for itself from its q4 blocks (lossless for this model:
its GGUF is Q4_1) or re-quantized int8 blocks; the target runs fp32.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import Telemetry, markdown_table, provenance, write_results
from bench.steps import prompt_ids, shape_config, verify_costs
from engine import Engine, Tokenizer, graphs, load_model, speculative
from engine.speculative import schedule
from engine.checkpoint import random_model
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
FULL = dict(new_tokens=64, prompts_per_set=2, temperatures=[0.0, 0.7], repeats=3, k=8, probe_tokens=32,
            depths=[8, 16, 24, 28])
QUICK = dict(new_tokens=24, prompts_per_set=1, temperatures=[0.0], repeats=1, k=8, probe_tokens=12, depths=[24])
# what the CPU weight-format kernels aim at, as a draft step over an fp32 step (fp32 ~19 ms, q4 ~4-5 ms), and a
# verify pass of T <= 9 positions there: their panel GEMMs stream each weight once for all T rows, so it costs
# about a step (plus the per-row work: attention, norms, sampling), here 5% of a step per extra position
KERNEL_TARGET_COST = {"q4": 0.25, "int8": 0.4}
KERNEL_VERIFY_SLOPE = 0.05
PROBE_K = 4  # the fixed k of the acceptance-by-position runs


def encode(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode_chat(text) if tok.chat_template else tok.encode(text)


def warm_up(eng: Engine, max_t: int) -> None:
    """First calls at a new shape pick kernels (oneDNN, MKL); keep that out of the timed runs."""
    with torch.inference_mode():
        eng.prefill(list(range(100, 132)))
        for t in range(1, max_t + 1):
            eng.chunk(torch.full((1, t), 100, device=eng.device))
            eng.rollback(32)


class Tally:
    """Decode figures of one mode pooled over runs, plus its round times by kind (for the cost columns)."""

    def __init__(self):
        self.tokens = self.decode_ms = self.drafted = self.accepted = self.spec_rounds = self.spec_emitted = 0
        self.draft_ms = self.round_ms = 0.0
        self.ks, self.step_ms, self.draft_token_ms = [], [], []
        self.rep_tok_s: list[float] = []
        self.position: dict[int, list[int]] = {}
        self.in_run = [0.0, 0.0]  # (decode ms at this run's own plain-step pace, decode ms) of runs with plain steps

    def add(self, stats) -> tuple[int, float]:
        rounds = stats.rounds
        tokens, ms = len(stats.ids) - 1, rounds[-1].t_end_ms - rounds[0].t_end_ms
        self.tokens += tokens
        self.decode_ms += ms
        steps = [r.total_ms for r in rounds[1:] if not r.n_drafted]
        if len(steps) >= 3:  # what plain decoding would have taken under this run's own load
            self.in_run[0] += tokens * statistics.mean(steps)
            self.in_run[1] += ms
        for r in rounds[1:]:
            self.draft_ms += r.draft_ms
            self.round_ms += r.total_ms
            if r.k is not None:
                self.ks.append(r.k)
            if r.n_drafted:
                self.drafted += r.n_drafted
                self.accepted += r.n_accepted
                self.spec_rounds += 1
                self.spec_emitted += len(r.emitted)
                self.draft_token_ms.append(r.draft_ms / r.n_drafted)
                for p in range(min(r.n_drafted, r.n_accepted + 1)):
                    self.position.setdefault(p, []).append(p < r.n_accepted)
            else:
                self.step_ms.append(r.total_ms)
        return tokens, ms

    def row(self, plain: Tally | None) -> dict:
        nan = float("nan")
        tok_s = 1e3 * self.tokens / self.decode_ms if self.decode_ms else nan
        out = dict(tokens=self.tokens, tok_s=tok_s,
                   acceptance_rate=self.accepted / self.drafted if self.drafted else nan,
                   mean_accepted_len=self.spec_emitted / self.spec_rounds if self.spec_rounds else nan,
                   mean_k=statistics.mean(self.ks) if self.ks else nan,
                   plain_round_pct=100 * sum(k == 0 for k in self.ks) / len(self.ks) if self.ks else nan,
                   draft_overhead_pct=100 * self.draft_ms / self.round_ms if self.round_ms else nan,
                   speedup_in_run=self.in_run[0] / self.in_run[1] if self.in_run[1] else nan)
        if plain is not None:
            ratios = [a / b for a, b in zip(self.rep_tok_s, plain.rep_tok_s, strict=True)]
            if ratios:  # the median repeat: a load spike from another job lands in one repeat, not in all
                out["speedup"], out["lo"], out["hi"] = statistics.median(ratios), min(ratios), max(ratios)
            else:
                out["speedup"] = tok_s / (1e3 * plain.tokens / plain.decode_ms)
        return out

    def acceptance_by_position(self) -> list[float]:
        return [sum(v) / len(v) for _, v in sorted(self.position.items())]


def projected(acceptance: list[float], draft_cost: float, verify: dict[int, float], k_max: int) -> tuple[float, int]:
    """(tokens per plain-step time, k) of the best fixed k by the schedule's formula: measured conditional
    acceptance by position, a draft step of draft_cost plain steps, verify[T] plain steps per verify pass."""
    best = (1.0, 0)
    for k in range(1, min(k_max, len(acceptance)) + 1):
        e = schedule.expected_tokens(acceptance[:k])[k]
        best = max(best, (e / (k * draft_cost + verify[k + 1]), k))
    return best


def bench(args, save) -> dict:
    grid = QUICK if args.quick else FULL
    repeats = args.repeats or grid["repeats"]
    # the target in fp32 on a CPU: its verify pass costs about a step (q4's costs ~2.4: T FMAs per weight)
    model = load_model(None, device=args.device, weights="fp32" if args.device == "cpu" else None)
    tok = Tokenizer(model.path)
    sets = {name: [encode(tok, p) for p in texts[: grid["prompts_per_set"]]] for name, texts in PROMPTS.items()}
    longest = max(len(p) for ps in sets.values() for p in ps)
    eng = Engine(model, max_seq_len=longest + grid["new_tokens"] + 32)
    if args.device == "cuda":
        graphs.enable(eng)
    k, n, first = grid["k"], grid["new_tokens"], sets["prose"][0]
    warm_up(eng, k + 1)
    out = dict(model=f"SmolLM2-135M-Instruct (embedded default), {model.dtype}, {model.weight_format} weights",
               device=args.device, threads=torch.get_num_threads(), grid=grid, repeats=repeats,
               kernels=eng.kernel_status, graphs=eng.graph_status, load_avg_start=os.getloadavg(), rows=[],
               verify=[], drafters=[], sweep=[], projection=[])
    t_start = time.perf_counter()

    def log(what: str, row: dict) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f}s] {what} " + " ".join(
            f"{key}={val:.3g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()), flush=True)

    # a verify pass of T positions over one decode step: what every drafted round pays
    costs = verify_costs(eng, first, ts=range(1, k + 2))
    verify = {T: costs[f"verify{T}_over_step"] for T in range(1, k + 2)}
    out["verify"] = [dict(T=T, ms=costs[f"verify{T}_ms"], over_step=verify[T]) for T in verify]
    log("verify", {f"V{T}": v for T, v in verify.items()})

    self_q4 = speculative.self_drafter(eng, "q4")
    self_int8 = speculative.self_drafter(eng, "int8")
    layer_skip = speculative.LayerSkipDrafter(eng)
    modes = [  # (mode, what drafts, drafter factory, k, adaptive)
        ("ngram", "prompt lookup, n=3..1", speculative.NgramDrafter, k, True),
        ("ngram", "prompt lookup, n=3..1", speculative.NgramDrafter, 5, False),
        ("self_draft", "itself, q4 blocks", lambda: self_q4, k, True),
        ("self_draft", "itself, int8 blocks", lambda: self_int8, k, True),
        ("layer_skip", "calibrated on the prompt", lambda: layer_skip, k, True),
    ]

    def run(mode, prompt, temperature, tokens=n):
        if mode is None:
            return eng.generate(prompt, tokens, temperature=temperature)[1]
        _, _, make, k_max, adaptive = mode
        return speculative.generate(eng, make(), prompt, k=k_max, max_new_tokens=tokens, temperature=temperature,
                                    adaptive=adaptive)[1]

    for mode in modes:  # untimed: first calls at new shapes, and each model drafter learns its draft cost
        run(mode, first, 0.0, 2 * k + 2)

    for temperature in grid["temperatures"]:
        for set_name, prompts in sets.items():
            tallies = [Tally() for _ in range(len(modes) + 1)]
            order = list(zip(tallies, [None, *modes], strict=True))
            for rep in range(repeats):
                # each repeat starts one mode later, so no mode always runs first (or last) after a change of load
                for tally, mode in order[rep % len(order):] + order[:rep % len(order)]:
                    tokens = ms = 0
                    for prompt in prompts:
                        t, m = tally.add(run(mode, prompt, temperature))
                        tokens, ms = tokens + t, ms + m
                    tally.rep_tok_s.append(1e3 * tokens / ms)
            for tally, mode in zip(tallies, [None, *modes], strict=True):
                name, what, _, k_max, adaptive = mode or ("plain", "-", None, None, None)
                row = dict(set=set_name, temperature=temperature, mode=name, k=k_max,
                           adaptive=adaptive, draft=what, **tally.row(None if mode is None else tallies[0]))
                out["rows"].append(row)
                log("run", row)
            save(out)

    # each drafter at a fixed k: acceptance by position and its draft cost, whether or not the schedule drafts
    probes = [("self_draft", "itself, q4 blocks", self_q4, "q4"), ("self_draft", "itself, int8 blocks", self_int8,
              "int8"), ("layer_skip", "calibrated on the prompt", layer_skip, None)]
    for temperature in grid["temperatures"]:
        for set_name, prompts in sets.items():
            plain = Tally()
            plain.add(run(None, prompts[0], temperature, grid["probe_tokens"]))
            step = statistics.median(plain.step_ms)
            for name, what, drafter, fmt in probes:
                t = Tally()
                t.add(speculative.generate(eng, drafter, prompts[0], k=PROBE_K, max_new_tokens=grid["probe_tokens"],
                                           temperature=temperature, adaptive=False)[1])
                acc = t.acceptance_by_position()
                cost = statistics.median(t.draft_token_ms) / step
                row = dict(set=set_name, temperature=temperature, mode=name, draft=what, k=PROBE_K,
                           draft_cost=cost, acceptance=t.accepted / t.drafted, by_position=[round(a, 2) for a in acc],
                           **{"speedup_fixed_k": t.row(plain)["speedup"]})
                if layer_skip is drafter:
                    row["draft"] += f" ({drafter.describe()['draft_layers']} layers)"
                out["drafters"].append(row)
                log("probe", row)
                now, k_now = projected(acc, cost, verify, k)
                proj = dict(set=set_name, temperature=temperature, mode=name, draft=row["draft"],
                            draft_cost=cost, predicted_now=now, k_now=k_now)
                if fmt is not None:
                    target = KERNEL_TARGET_COST[fmt]
                    kernel_verify = {T: 1 + KERNEL_VERIFY_SLOPE * (T - 1) for T in verify}
                    proj["kernel_draft_cost"] = target
                    proj["predicted_at_kernel_cost"], proj["k_at_kernel_cost"] = projected(acc, target, verify, k)
                    proj["predicted_with_kernels"], proj["k_with_kernels"] = projected(acc, target, kernel_verify, k)
                out["projection"].append(proj)
            save(out)

    # layer-skip: the first N layers against the calibrated set, fixed k=3, temperature 0, each set's first prompt
    for set_name, prompts in sets.items():
        plain = Tally()
        plain.add(run(None, prompts[0], 0.0))
        for depth in [*grid["depths"], None]:
            drafter = layer_skip if depth is None else speculative.LayerSkipDrafter(eng, n_layers=depth)
            t = Tally()
            t.add(speculative.generate(eng, drafter, prompts[0], k=3, max_new_tokens=n, adaptive=False)[1])
            info = drafter.describe()
            row = dict(set=set_name, layers="calibrated" if depth is None else f"first {depth}",
                       draft_layers=info["draft_layers"], skipped=info["skipped_layers"],
                       acceptance=t.accepted / t.drafted,
                       draft_cost=statistics.median(t.draft_token_ms) / statistics.median(plain.step_ms),
                       speedup_fixed_k3=t.row(plain)["speedup"])
            out["sweep"].append(row)
            log("sweep", row)
        save(out)
    out["wall_s"] = time.perf_counter() - t_start
    out["load_avg_end"] = os.getloadavg()
    return out


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
    load = result.get("load_avg_start"), result.get("load_avg_end")
    parts = [
        f"Speculative decoding on {result['device']} ({result['threads']} threads), {result['model']}, "
        f"kernels: {result['kernels']}; {g['new_tokens']} new tokens, {g['prompts_per_set']} chat prompt(s) per "
        f"set, {result['repeats']} interleaved repeat(s); load average at start / end: {load[0]} / {load[1]}. "
        "speedup = decode tok/s over plain decoding's on the same prompts and temperature in the same repeat, the "
        "median over repeats (lo / hi: the worst and best repeat). speedup_in_run: decode tok/s over the pace of "
        "the run's own plain steps (their mean), in runs that made at least 3 (plain decoding: 1): immune to load "
        "changing between runs, it shows what drafting cost or gained where the schedule mostly decoded plainly. "
        "k is the most a round drafts; adaptive rounds pick their own (mean_k; plain_round_pct: rounds made plain "
        "steps).\n\n",
        markdown_table(result["rows"], ["set", "temperature", "mode", "draft", "k", "adaptive", "tok_s", "speedup",
                                        "lo", "hi", "speedup_in_run", "acceptance_rate", "mean_accepted_len", "mean_k",
                                        "plain_round_pct", "draft_overhead_pct", "tokens"]),
        "\nWhat a round pays: a verify pass of T positions over one decode step (median of 12).\n\n",
        markdown_table(result["verify"], ["T", "ms", "over_step"]),
        f"\nEach drafter at fixed k={PROBE_K} on each set's first prompt ({g['probe_tokens']} tokens): draft_cost = "
        "ms per drafted token over a plain step's; acceptance by position is conditional on the positions before "
        "it being accepted.\n\n",
        markdown_table(result["drafters"], ["set", "temperature", "mode", "draft", "draft_cost", "acceptance",
                                            "by_position", "speedup_fixed_k"]),
        "\nLayer-skip sweep: the first N layers against the calibrated set (fixed k=3, temperature 0, each set's "
        "first prompt).\n\n",
        markdown_table(result["sweep"], ["set", "layers", "draft_layers", "skipped", "acceptance", "draft_cost",
                                         "speedup_fixed_k3"]),
        "\nThe schedule's formula (schedule.py) on the acceptance measured above, at the best fixed k: with "
        "this run's draft and verify costs (predicted_now); with a draft step at the cost the CPU weight-format "
        "kernels aim at (kernel_draft_cost) and this run's verify costs (predicted_at_kernel_cost); and with both "
        f"draft and verify at the kernels' targets (a verify pass of T positions at 1 + {KERNEL_VERIFY_SLOPE} (T - 1) "
        "steps: predicted_with_kernels). The kernel costs are assumptions, not measurements.\n\n",
        markdown_table(result["projection"], ["set", "temperature", "mode", "draft", "draft_cost", "predicted_now",
                                              "k_now", "kernel_draft_cost", "predicted_at_kernel_cost",
                                              "k_at_kernel_cost", "predicted_with_kernels", "k_with_kernels"]),
    ]
    return "".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description="speculative decoding benchmark")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="24 tokens, one prompt per set, temperature 0, one repeat")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats of every mode (default 3)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run with --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    with Telemetry(args.device) as tel:
        def save(result):  # after every case too: a run cut short keeps what it measured
            result["provenance"] = provenance(args.device, tel)
            write_results(args.out, f"spec-{args.device}" + ("-quick" if args.quick else ""), result,
                          markdown(result))

        result = cuda_bench(args, save) if args.device == "cuda" else bench(args, save)
    save(result)
    print(markdown(result))


if __name__ == "__main__":
    main()
