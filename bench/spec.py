"""Speculative decoding against plain decoding on the default model, as ratios measured within one run.

Three text sets of the project's own (bench/data/spec-*.txt): edit, requests to rename, reorder, convert or
correct a quoted passage of code or prose, whose answers copy their input with edits; prose and code, open
requests where a lookup rarely finds anything to copy. Two targets by default: q4, the default model's exact
values (16-bit activations), and fp32, whose verify pass costs about a decode step; q4_a8, the launch's format on
a CPU (the same blocks against 8-bit activations, as llama.cpp runs them), with --targets. Every mode drafts
with the adaptive schedule (k is the most a round drafts). Each repeat runs every prompt of a set under plain
decoding and every mode back to back, the modes' order rotated from prompt to prompt
(bench.common.alternation), so the modes share the machine's load; speedup = a mode's decode tok/s over
plain's, pooled over the set's prompts in the same repeat, the median over repeats (lo / hi: the worst and the
best).
Decode tok/s excludes the first token, as Stats does.

Then what explains the figures: a verify pass of T positions over one decode step on each target (what a
drafted round pays; the schedule weighs what it measures, whatever that is), and what limits the lookup on each
set, measured on plain decoding's own greedy text (bench/spec_analysis.py): how long its matches are and how
often each length is right, how often the latest occurrence is wrong where another is right, what the latest,
the chosen and the best candidate copy, how soon a proposal is right again after the copy breaks, and a replay
of each lookup with the real schedule at this run's verify costs and at the verify cost the kernels aim at.

Open text no constant was tuned on (prompts generated from a fixed seed, a held-out half), the cost of a round
that does not draft against a plain step, layer-skip at the page's defaults and drafting from a session's earlier
outputs: bench/spec_open.py.

    python -m bench.spec --device cpu [--out bench/results] [--quick] [--repeats 3]
    python -m bench.spec --targets q4 q4_a8 fp32 --name spec-cpu-zen4   # one CPU kind's table beside the others
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench import spec_analysis as analysis
from bench.common import alternation, markdown_table, run_and_save
from bench.steps import prompt_ids, shape_config, verify_costs
from engine import Engine, Tokenizer, load_model, speculative
from engine.checkpoint import random_model
from engine.request import Request
import torch

DATA = Path(__file__).parent / "data"
SETS = ("edit", "prose", "code")
K = speculative.K_MAX
PAGE_K = Request().k  # the page's default k (and the CLI's)
FULL = dict(new_tokens=128, prompts_per_set=None, repeats=3, sampled=0.7)
QUICK = dict(new_tokens=24, prompts_per_set=2, repeats=1, sampled=None)
GOALS = [("q4", "edit", ">=", 2.0), ("fp32", "edit", ">=", 2.5), *[(t, s, ">=", 0.97) for t in ("q4", "fp32")
                                                                       for s in ("prose", "code")]]
GOALS += [("q4_a8", s, op, g) for t, s, op, g in GOALS if t == "q4"]  # q4's blocks, its goals
Q4_TARGETS = ("q4", "q4_a8")  # the default model's own blocks: the page's k and sampled runs are timed on them
# the verify cost the CPU kernels aim at: 6 positions <= 1.3 steps, 16 <= 2.0; an assumption
# for the replay, not a measurement
KERNEL_GOAL = {T: 1 + 0.06 * (T - 1) if T <= 6 else 1.3 + 0.07 * (T - 6) for T in range(1, K + 2)}


def read_set(name: str) -> dict[str, str]:
    """bench/data/spec-NAME.txt: prompts, each under a `### title` line."""
    prompts, title, lines = {}, None, []
    for line in (DATA / f"spec-{name}.txt").read_text(encoding="utf-8").splitlines() + ["### end"]:
        if line.startswith("### "):
            if title is not None:
                prompts[title] = "\n".join(lines).strip("\n")
            title, lines = line[4:].strip(), []
        else:
            lines.append(line)
    return prompts


def modes(target: str, eng: Engine) -> list[tuple]:
    """(mode, what drafts, drafter factory, k) of the rows timed against plain decoding on a target."""
    rows = [("ngram", "lookup", speculative.NgramDrafter, K),
            ("ngram_latest", "latest-match lookup (before)", analysis.LatestMatch, K)]
    if target in Q4_TARGETS:
        rows.insert(1, ("ngram", f"lookup, the page's k={PAGE_K}", speculative.NgramDrafter, PAGE_K))
    else:  # a model drafter pays only where a verify pass costs about a step
        self_q4 = speculative.self_drafter(eng, "q4")
        rows.append(("self_draft", "itself, q4 blocks", lambda: self_q4, 8))
    return rows


def warm_up(eng: Engine, max_t: int) -> None:
    """First calls at a new shape pick kernels (oneDNN, MKL); keep that out of the timed runs."""
    with torch.inference_mode():
        eng.prefill(list(range(100, 132)))
        for t in range(1, max_t + 1):
            eng.chunk(torch.full((1, t), 100, device=eng.device))
            eng.rollback(32)


class Tally:
    """Decode figures of one mode pooled over runs."""

    def __init__(self):
        self.tokens = self.decode_ms = self.drafted = self.accepted = self.spec_rounds = self.accepted_len = 0
        self.draft_ms = self.round_ms = 0.0
        self.ks: list[int] = []
        self.rep_tok_s: list[float] = []
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
                self.accepted_len += r.accepted_len
        return tokens, ms

    def row(self, plain: Tally | None) -> dict:
        nan = float("nan")
        out = dict(tokens=self.tokens, tok_s=1e3 * self.tokens / self.decode_ms if self.decode_ms else nan,
                   acceptance_rate=self.accepted / self.drafted if self.drafted else nan,
                   mean_accepted_len=self.accepted_len / self.spec_rounds if self.spec_rounds else nan,
                   mean_k=statistics.mean(self.ks) if self.ks else nan,
                   plain_round_pct=100 * sum(k == 0 for k in self.ks) / len(self.ks) if self.ks else nan,
                   draft_overhead_pct=100 * self.draft_ms / self.round_ms if self.ks else nan,
                   speedup_in_run=self.in_run[0] / self.in_run[1] if self.in_run[1] else nan)
        if plain is not None:  # the median repeat: a load spike from another job lands in one repeat, not in all
            ratios = [a / b for a, b in zip(self.rep_tok_s, plain.rep_tok_s, strict=True)]
            out["speedup"], out["lo"], out["hi"] = statistics.median(ratios), min(ratios), max(ratios)
        return out


def alternating(modes: list, prompts: list, repeats: int, run, seen=None) -> list[Tally]:
    """A Tally per mode of run(mode, prompt) over the prompts, run in bench.common.alternation's order, each
    repeat's tok/s pooled over the prompts; seen(mode, prompt index, stats) is told of every run."""
    tallies = [Tally() for _ in modes]
    sums = {(m, rep): [0, 0.0] for m in range(len(modes)) for rep in range(repeats)}
    for rep, i, m in alternation(len(modes), len(prompts), repeats):
        stats = run(modes[m], prompts[i])
        if seen is not None:
            seen(modes[m], i, stats)
        t, ms = tallies[m].add(stats)
        sums[m, rep][0] += t
        sums[m, rep][1] += ms
    for (m, _rep), (tokens, ms) in sorted(sums.items()):  # each mode's repeats in order
        tallies[m].rep_tok_s.append(1e3 * tokens / ms)
    return tallies


def timed(eng: Engine, target: str, sets: dict, grid: dict, repeats: int, log) -> tuple[list[dict], dict]:
    """The timed rows of one target, and plain decoding's greedy ids per (set, prompt index)."""
    rows, greedy, n, all_modes = [], {}, grid["new_tokens"], modes(target, eng)
    temperatures = [0.0] + ([grid["sampled"]] if grid["sampled"] and target in Q4_TARGETS else [])
    for temperature in temperatures:
        mode_list = [None, *all_modes] if temperature == 0 else [None, all_modes[0]]

        def run(mode, prompt, temperature=temperature):
            if mode is None:
                return eng.generate(prompt, n, temperature=temperature)[1]
            return speculative.generate(eng, mode[2](), prompt, k=mode[3], max_new_tokens=n,
                                        temperature=temperature)[1]

        for mode in mode_list[1:]:  # untimed: first calls at new shapes; a model drafter learns its draft cost
            run(mode, sets["edit"][0])
        for set_name, prompts in sets.items():
            def seen(mode, i, stats, set_name=set_name, temperature=temperature):
                if mode is None and temperature == 0:
                    greedy[set_name, i] = stats.ids
            tallies = alternating(mode_list, prompts, repeats, run, seen)
            for tally, mode in zip(tallies, mode_list, strict=True):
                name, what, _, k = mode or ("plain", "-", None, None)
                row = dict(target=target, set=set_name, temperature=temperature, mode=name, draft=what, k=k,
                           **tally.row(None if mode is None else tallies[0]))
                rows.append(row)
                log("run", row)
    return rows, greedy


def replay_rows(target: str, sets: dict, greedy: dict, verify: dict[int, float]) -> list[dict]:
    """Each lookup with the real schedule over plain decoding's text, at this run's verify costs and at the
    kernels' goal; and with a schedule that knows each proposal's outcome."""
    rows = []
    for set_name, prompts in sets.items():
        row = dict(target=target, set=set_name)
        for name, make in (("latest", analysis.LatestMatch), ("lookup", speculative.NgramDrafter)):
            for costs, cost_name in ((verify, "measured"), (KERNEL_GOAL, "kernel_goal")):
                for oracle in (False, True):
                    ms = tokens = 0.0
                    for i, prompt in enumerate(prompts):
                        t, n = analysis.replay(make, prompt, greedy[set_name, i], costs, oracle=oracle)
                        ms, tokens = ms + t, tokens + n
                    row[f"{name}_{cost_name}" + ("_ceiling" if oracle else "")] = tokens / ms
        rows.append(row)
    return rows


def bench(args, save) -> dict:
    grid = QUICK if args.quick else FULL
    repeats = args.repeats or grid["repeats"]
    out = dict(model="SmolLM2-135M-Instruct (embedded default)", device=args.device, threads=torch.get_num_threads(),
               grid=grid, repeats=repeats, k=K, load_avg_start=os.getloadavg(), targets={}, rows=[], verify=[],
               analysis=[], replay=[], goals=[])
    t_start = time.perf_counter()

    def log(what: str, row: dict) -> None:
        print(f"[{time.perf_counter() - t_start:6.0f}s] {what} " + " ".join(
            f"{key}={val:.3g}" if isinstance(val, float) else f"{key}={val}" for key, val in row.items()), flush=True)

    for target in args.targets:
        model = load_model(None, device=args.device, weights=target)
        tok = Tokenizer(model.path)
        sets = {name: [tok.encode_chat(text) for text in list(read_set(name).values())[:grid["prompts_per_set"]]]
                for name in args.sets}
        eng = Engine(model, max_seq_len=max(len(p) for ps in sets.values() for p in ps) + grid["new_tokens"] + 32)
        warm_up(eng, K + 1)
        out["targets"][target] = dict(weights=model.weight_format, dtype=str(model.dtype), kernels=eng.kernel_status)
        # a verify pass of T positions over one decode step: what every drafted round pays
        costs = verify_costs(eng, next(iter(sets.values()))[0], ts=range(1, K + 2))
        verify = {1: 1.0} | {T: costs[f"verify{T}_over_step"] for T in range(2, K + 2)}
        out["verify"] += [dict(target=target, T=T, ms=costs[f"verify{T}_ms"], over_step=costs[f"verify{T}_over_step"],
                               kernel_goal=KERNEL_GOAL[T]) for T in range(1, K + 2)]
        log("verify", {f"V{T}": v for T, v in verify.items()})
        rows, greedy = timed(eng, target, sets, grid, repeats, log)
        out["rows"] += rows
        save(out)
        if target == "q4":  # the texts are the target's greedy output; the lookup's limits are the text's
            for set_name, prompts in sets.items():
                stats = [analysis.lookup_stats(p, greedy[set_name, i]) for i, p in enumerate(prompts)]
                out["analysis"].append(dict(set=set_name, **analysis.pool(stats)))
        out["replay"] += replay_rows(target, sets, greedy, verify)
        save(out)
    for target, set_name, _, goal in GOALS:
        if target not in args.targets or set_name not in args.sets:
            continue
        got = next(r["speedup"] for r in out["rows"] if (r["target"], r["set"], r["mode"], r["k"],
                                                          r["temperature"]) == (target, set_name, "ngram", K, 0.0))
        out["goals"].append(dict(target=target, set=set_name, mode=f"ngram k={K}", speedup=got, goal=f">= {goal}",
                                 met="yes" if got >= goal else "no"))
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


ANALYSIS_COLS = ["set", "positions", "no_match_pct", "match_1_pct", "right_at_1", "match_2-3_pct", "right_at_2-3",
                 "match_4-7_pct", "right_at_4-7", "match_8+_pct", "right_at_8+", "latest_wrong_other_right_pct",
                 "latest_tokens", "chosen_tokens", "best_tokens", "breaks", "back_latest", "back_chosen"]
REPLAY_COLS = ["target", "set", "latest_measured", "lookup_measured", "lookup_measured_ceiling",
               "latest_kernel_goal", "lookup_kernel_goal", "lookup_kernel_goal_ceiling"]


def markdown(result: dict) -> str:
    if result["device"] == "cuda":
        cols = ["graph", "step_ms"] + [f"verify{T}_over_step" for T in range(1, 10)]
        return (f"Verify pass of T tokens over one decode step on CUDA, {result['model']} "
                f"({result['kernels']}).\n\n" + markdown_table(result["rows"], cols))
    g, load = result["grid"], (result.get("load_avg_start"), result.get("load_avg_end"))
    targets = "; ".join(f"{t}: {v['weights']} weights, {v['kernels']}" for t, v in result["targets"].items())
    return "".join([
        f"Speculative decoding on {result['device']} ({result['threads']} threads), {result['model']} ({targets}); "
        f"{g['new_tokens']} new tokens per chat prompt, the sets of bench/data/spec-*.txt, {result['repeats']} "
        f"interleaved repeat(s); load average at start / end: {load[0]} / {load[1]}.\n\n"
        f"Goals: n-gram lookup with the adaptive schedule, k <= {result['k']}, temperature 0.\n\n",
        markdown_table(result["goals"], ["target", "set", "mode", "speedup", "goal", "met"]),
        "\nspeedup = decode tok/s over plain decoding's on the same prompts in the same repeat, the median over "
        "repeats (lo / hi: the worst and best repeat). speedup_in_run: decode tok/s over the pace of the run's own "
        "plain steps, in runs that made at least 3: immune to load changing between runs. mean_accepted_len: "
        "tokens per verify pass (accepted drafts + 1, Round.accepted_len); draft_overhead_pct: the drafter's share "
        "of the decode rounds' time, plain rounds included; mean_k / plain_round_pct: the schedule's choices.\n\n",
        markdown_table(result["rows"], ["target", "set", "temperature", "mode", "draft", "k", "tok_s", "speedup", "lo",
                                        "hi", "speedup_in_run", "acceptance_rate", "mean_accepted_len", "mean_k",
                                        "plain_round_pct", "draft_overhead_pct", "tokens"]),
        "\nWhat a round pays: a verify pass of T positions over one decode step (the median of 3 alternating "
        "rounds of 12 passes), beside the kernels' goal (6 positions <= 1.3 steps, 16 <= 2.0; an assumption).\n\n",
        markdown_table(result["verify"], ["target", "T", "ms", "over_step", "kernel_goal"]),
        "\nWhat limits the lookup, on plain decoding's greedy text (q4 target) at every output position: the "
        "share of positions whose longest match (followed back up to 16 tokens) is 1, 2-3, 4-7 or 8+ tokens "
        "long (none: no_match_pct) and how often the chosen proposal's first token is right there (right_at_*); "
        "latest_wrong_other_right_pct: positions with a match where the latest occurrence's proposal is wrong "
        "and another occurrence's is right; *_tokens: tokens a 16-token copy gets right on average from the "
        "latest occurrence, the chosen one (the lookup's choice: longest match, at or after the anchor, latest) "
        "and the best one; breaks: places the copy stops being right (an edit, the passage's end), back_*: "
        "positions until each lookup is right again (8: not within 8).\n\n",
        markdown_table(result["analysis"], ANALYSIS_COLS),
        "\nThe lookups replayed with the real schedule over plain decoding's text: tokens per plain-step time at "
        "this run's verify costs (measured) and at the kernels' goal, and the ceiling of a schedule that knows "
        "each proposal's outcome (drafts exactly what will be kept). The timed rows above pay host time "
        "besides.\n\n",
        markdown_table(result["replay"], REPLAY_COLS),
    ])


def main(argv=None):
    p = argparse.ArgumentParser(description="speculative decoding benchmark")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true", help="24 tokens, two prompts per set, temperature 0, one repeat")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats of every mode (default 3)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--targets", nargs="+", default=["q4", "fp32"], help="the weight formats timed (default q4 fp32)")
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", help="the results' file name (one per CPU kind; default spec-DEVICE plus the targets "
                                   "and sets that differ from the defaults)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device; run with --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    chosen = ([] if args.targets == ["q4", "fp32"] else args.targets) + ([] if args.sets == list(SETS) else args.sets)
    name = args.name or "-".join([f"spec-{args.device}", *chosen] + (["quick"] if args.quick else []))
    run_and_save(args.out, name, args.device,
                 lambda save: cuda_bench(args, save) if args.device == "cuda" else bench(args, save), markdown)


if __name__ == "__main__":
    main()
