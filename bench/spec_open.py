"""Speculative decoding on open text no constant was tuned on, the cost of a round that does not draft, and
drafting from a session's earlier outputs over a sequence of related requests; the default model in its launch
format (q4_a8 on a CPU: the file's Q4_1 blocks as llama.cpp runs them, checkpoint/formats.py; --weights q4 for its
exact values), the page's defaults (k = Request().k, 8 today, adaptive; n-gram n <= 3; layer-skip calibrated
on each prompt).

Open text: prompts generated from a fixed seed, open requests (a story, an explanation, a letter) about topics
drawn from the model's own vocabulary (whole-word tokens of 5-10 letters), so no prompt was read while any
constant was chosen. The even-numbered prompts are the tuning half, the odd-numbered the held-out half: a
constant fitted on this benchmark may look at the first only, and both are reported apart.

Each repeat runs every prompt of a half under plain decoding and every mode back to back, the modes' order
rotated from prompt to prompt (bench.common.alternation); ratio = a mode's decode tok/s over plain's in the same
repeat, the median over repeats (lo / hi: worst and best). plain_round_over_step: the median round that did not draft
inside the mode's runs over the median plain step of plain decoding's runs in the same repeat (the goal is
<= 1.02), and the same of the plain rounds right after a plain round and right after a drafted one (a verify pass
slows the steps after it where the weights sit in a cache it ages: bench/step_after.py); choice_us: what the
drafter and the schedule took in those rounds (Round.draft_ms).

Related requests: one rename applied to variants of a function, in order, each answer copying its prompt with
the same edits; n-gram lookup alone, and with a SessionIndex shared by the sequence (fresh each repeat).

    python -m bench.spec_open [--quick] [--repeats 3] [--weights q4] [--out bench/results] [--name spec-open-cpu-<kind>]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import engine  # noqa: F401  (first: it sets OpenMP's wait policy before torch loads)
from bench.common import alternation, markdown_table, run_and_save
from engine import Engine, Tokenizer, load_model, speculative
from engine.request import Request

SEED = 2026
PAGE_K = Request().k  # the page's default k (and the CLI's)
OPEN = ["Write a short story about a {a} who finds a {b}.", "Explain in a paragraph how a {a} and a {b} differ.",
        "Write a friendly letter to a neighbour about the {a} and the {b}.", "Describe a day spent with a {a}.",
        "Write a poem about {a} and {b}.", "Tell me what a child might think of a {a} and why."]
CODE = '''def {fn}(items, limit={a}):
    total = 0
    for item in items:
        if item > limit:
            total += item * {b}
    return total'''
RENAME = "Rename the function {fn} to {new} and the variable total to {var} in this code:\n```python\n{code}\n```"
FULL = dict(new_tokens=128, open_prompts=12, related=4, repeats=3)
QUICK = dict(new_tokens=32, open_prompts=4, related=3, repeats=1)


def words(tok: Tokenizer, rng: random.Random, n: int) -> list[str]:
    """n distinct lowercase words drawn from the tokenizer's whole-word tokens."""
    pieces = (tok.decode([i]) for i in range(tok.vocab_size))
    vocab = sorted({w[1:] for w in pieces if w[:1] == " " and w[1:].isalpha() and w[1:].islower()
                    and 5 <= len(w) <= 11})
    return rng.sample(vocab, n)


def open_prompts(tok: Tokenizer, n: int) -> list[str]:
    rng = random.Random(SEED)
    w = words(tok, rng, 2 * n)
    return [rng.choice(OPEN).format(a=w[2 * i], b=w[2 * i + 1]) for i in range(n)]


def related_prompts(tok: Tokenizer, n: int) -> list[str]:
    rng = random.Random(SEED + 1)
    fn, new, var = words(tok, rng, 3)
    return [RENAME.format(fn=fn, new=new, var=var, code=CODE.format(fn=fn, a=rng.randint(1, 99),
                                                                      b=rng.randint(2, 9))) for _ in range(n)]


class Figures(NamedTuple):
    """Decode figures of a run, or of a mode's runs summed over a repeat."""
    tokens: int  # after the first
    ms: float  # their time
    rounds: list[float]  # plain rounds' ms
    choice: list[float]  # plain rounds' drafter ms
    after: list[bool]  # whether each plain round came right after a drafted one

    def __add__(self, other: Figures) -> Figures:
        return Figures(*(a + b for a, b in zip(self, other, strict=True)))


def decode_figures(stats) -> Figures:
    r = stats.rounds
    pairs = [(before, x) for before, x in zip(r[:-1], r[1:], strict=True) if not x.n_drafted]
    return Figures(len(stats.ids) - 1, r[-1].t_end_ms - r[0].t_end_ms, [x.total_ms for _, x in pairs],
                   [x.draft_ms for _, x in pairs], [bool(before.n_drafted) for before, _ in pairs])


def alternate(modes: dict, prompts: list, run, repeats: int) -> dict:
    """{mode: [Figures summed over the prompts, per repeat]}, run in bench.common.alternation's order;
    modes[name]() gives a mode's state for a repeat (a session, which then sees the prompts in order)."""
    names = list(modes)
    states: dict = {}
    sums = {(n, rep): Figures(0, 0.0, [], [], []) for n in names for rep in range(repeats)}
    for rep, i, m in alternation(len(names), len(prompts), repeats):
        name = names[m]
        if (name, rep) not in states:
            states[name, rep] = modes[name]()
        sums[name, rep] += decode_figures(run(name, states[name, rep], prompts[i]))
    return {n: [sums[n, rep] for rep in range(repeats)] for n in names}


def over_step(reps: list[Figures], plain: list[Figures], after: bool | None = None) -> float | None:
    """The median over repeats of the mode's median plain round (all of them, or only those right after a drafted
    round, after=True, or after a plain one, after=False) over plain decoding's median step in the same repeat."""
    ratios = []
    for rep, p in zip(reps, plain, strict=True):
        kept = [ms for ms, a in zip(rep.rounds, rep.after, strict=True) if after is None or a == after]
        if kept:
            ratios.append(statistics.median(kept) / statistics.median(p.rounds))
    return statistics.median(ratios) if ratios else None


def rows_of(times: dict, **key) -> list[dict]:
    plain = times["plain"]
    rows = []
    for name, reps in times.items():
        row = dict(key, mode=name, tok_s=statistics.median(1e3 * rep.tokens / rep.ms for rep in reps))
        if name != "plain":
            ratios = [(rep.tokens / rep.ms) / (p.tokens / p.ms) for rep, p in zip(reps, plain, strict=True)]
            choice = [c for rep in reps for c in rep.choice]
            row |= dict(ratio=statistics.median(ratios), lo=min(ratios), hi=max(ratios),
                        plain_round_over_step=over_step(reps, plain),
                        after_plain_over_step=over_step(reps, plain, after=False),
                        after_draft_over_step=over_step(reps, plain, after=True),
                        choice_us=1e3 * statistics.median(choice) if choice else None,
                        plain_rounds=sum(len(rep.rounds) for rep in reps),
                        after_draft_rounds=sum(sum(rep.after) for rep in reps))
        rows.append(row)
    return rows


def bench(args, save) -> dict:
    grid = QUICK if args.quick else FULL
    repeats = args.repeats or grid["repeats"]
    model = load_model(None, device="cpu", weights=args.weights)
    tok = Tokenizer(model.path)
    texts = open_prompts(tok, grid["open_prompts"])
    halves = {"tune": [tok.encode_chat(t) for t in texts[0::2]], "held_out": [tok.encode_chat(t) for t in texts[1::2]]}
    related = [tok.encode_chat(t) for t in related_prompts(tok, grid["related"])]
    n = grid["new_tokens"]
    eng = Engine(model, max_seq_len=max(len(p) for p in related + halves["tune"] + halves["held_out"]) + n + 8)
    layer_skip = speculative.LayerSkipDrafter(eng)  # kept between runs, as the page keeps it
    out = dict(model=f"SmolLM2-135M-Instruct (embedded default), {model.weight_format}", kernels=eng.kernel_status,
               weights=model.weight_format, grid=grid,
               repeats=repeats, seed=SEED, open_prompts=texts, related_prompts=related_prompts(tok, 2),
               load_avg_start=os.getloadavg(), rows=[], related=[])
    t0 = time.perf_counter()

    def run(temperature):
        def one(name, state, prompt):
            if name == "plain":
                return eng.generate(prompt, n, temperature=temperature, stop_ids=[])[1]
            drafter = {"ngram": lambda: speculative.NgramDrafter(max_n=3), "layer_skip": lambda: layer_skip,
                       "ngram_session": lambda: speculative.NgramDrafter(max_n=3, session=state)}[name]()
            stats = speculative.generate(eng, drafter, prompt, k=PAGE_K, max_new_tokens=n, temperature=temperature,
                                         stop_ids=[])[1]
            if state is not None:  # the session's owner adds each answer, as the page does
                state.add(stats.ids)
            return stats
        return one

    none = lambda: None  # noqa: E731
    run(0.0)("layer_skip", None, halves["tune"][0])  # untimed: first calls at new shapes
    for temperature in (0.0, 0.7):
        for half, prompts in halves.items():
            times = alternate(dict(plain=none, ngram=none, layer_skip=none), prompts, run(temperature), repeats)
            out["rows"] += rows_of(times, set=half, temperature=temperature)
            print(f"[{time.perf_counter() - t0:5.0f}s]", out["rows"][-3:], flush=True)
            save(out)
        times = alternate(dict(plain=none, ngram=none, ngram_session=speculative.SessionIndex), related,
                          run(temperature), repeats)
        out["related"] += rows_of(times, set="related", temperature=temperature)
        save(out)
    out["wall_s"], out["load_avg_end"] = time.perf_counter() - t0, os.getloadavg()
    return out


COLS = ["set", "temperature", "mode", "tok_s", "ratio", "lo", "hi", "plain_round_over_step", "after_plain_over_step",
        "after_draft_over_step", "choice_us", "plain_rounds", "after_draft_rounds"]


def markdown(result: dict) -> str:
    g = result["grid"]
    return "".join([
        f"Speculative modes at the page's defaults on open text no constant was tuned on, {result['model']} "
        f"({result['kernels']}); {g['new_tokens']} new tokens per prompt, {result['repeats']} alternating "
        f"repeat(s), prompts from seed {result['seed']}; load average at start / end: {result['load_avg_start']} / "
        f"{result.get('load_avg_end')}. Goal: ratio >= 0.97, plain_round_over_step <= 1.02.\n\n",
        markdown_table(result["rows"], COLS),
        "\nRelated requests in order (one rename over variants of a function): the lookup alone, and drafting "
        "also from the session's earlier answers.\n\n",
        markdown_table(result["related"], COLS),
    ])


def main(argv=None):
    p = argparse.ArgumentParser(description="speculative decoding on open text and related requests")
    p.add_argument("--quick", action="store_true", help="32 tokens, 2 prompts a half, one repeat")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--weights", default=None, help="the target's format (default: the launch's, as the page starts)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    p.add_argument("--name", default="spec-open-cpu", help="the results' file name (one per CPU kind)")
    args = p.parse_args(argv)
    run_and_save(args.out, args.name + ("-quick" if args.quick else ""), "cpu",
                 lambda save: bench(args, save), markdown)


if __name__ == "__main__":
    main()
