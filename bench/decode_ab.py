"""Two source trees' whole decoding on the default model, as a user runs it: a change to the step or the pick and
the commit before it.

    python -m bench.decode_ab --baseline /tmp/before [--rounds 8] [--name decode-ab-<change>]

Each round runs this tree and the baseline in fresh processes, one after the other (the order turned every round),
since two builds of the extension cannot share a process. Each process loads the default model in its launch
format and, after an untimed warm-up, runs greedy decoding through Engine.generate over the open prompts of
bench.spec_open (held-out half) and n-gram speculative decoding at the page's k over the copy set's prompts
(bench/data/spec-edit.txt), 96 new tokens each. Per process: plain ms a token (the median round after the first),
its pick (Round.sample_ms, median), and both modes' decode tok/s over all their tokens. The table gives each
tree's median over rounds and the median of the rounds' own new / baseline ratios; the token ids of both trees are
compared (greedy: a change to the pick that moves a token is a bug, not a speed-up).
"""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from bench.common import in_tree, markdown_table, provenance, write_results

CHILD = r"""
import json, statistics, sys
import engine  # noqa: F401  (OpenMP's wait policy before torch loads)
import torch
from engine import Engine, Tokenizer, load_model, speculative
from engine.request import Request
from bench.spec import read_set
from bench.spec_open import open_prompts
n = int(sys.argv[1])
model = load_model(None, device="cpu", progress=lambda msg: None)
tok = Tokenizer(model.path)
plain_prompts = [tok.encode_chat(t) for t in open_prompts(tok, 8)[1::2]]
copy_prompts = [tok.encode_chat(t) for t in list(read_set("edit").values())[:4]]
eng = Engine(model, max_seq_len=max(len(p) for p in plain_prompts + copy_prompts) + max(n, 16) + 8)
eng.generate(plain_prompts[0], 16, stop_ids=[])
speculative.generate(eng, speculative.NgramDrafter(max_n=3), copy_prompts[0], k=Request().k, max_new_tokens=16,
                     stop_ids=[])
gaps, picks, ids, tokens, ms = [], [], [], {"plain": 0, "ngram": 0}, {"plain": 0.0, "ngram": 0.0}
for p in plain_prompts:
    out, stats = eng.generate(p, n, stop_ids=[])
    r = stats.rounds
    gaps += [b.t_end_ms - a.t_end_ms for a, b in zip(r[1:], r[2:])]
    picks += [x.sample_ms for x in r[1:]]
    ids.append(out)
    tokens["plain"] += len(out) - 1
    ms["plain"] += r[-1].t_end_ms - r[0].t_end_ms
for p in copy_prompts:
    out, stats = speculative.generate(eng, speculative.NgramDrafter(max_n=3), p, k=Request().k, max_new_tokens=n,
                                      stop_ids=[])
    r = stats.rounds
    ids.append(out)
    tokens["ngram"] += len(out) - 1
    ms["ngram"] += r[-1].t_end_ms - r[0].t_end_ms
print("RESULT " + json.dumps(dict(
    format=model.weight_format, ms_a_token=statistics.median(gaps), pick_ms=statistics.median(picks),
    plain_tok_s=1e3 * tokens["plain"] / ms["plain"], ngram_tok_s=1e3 * tokens["ngram"] / ms["ngram"], ids=ids)))
"""
FIGURES = ("ms_a_token", "pick_ms", "plain_tok_s", "ngram_tok_s")


def run(this: Path, baseline: Path, rounds: int, new_tokens: int) -> dict:
    trees = {"new": this, "baseline": baseline}
    # the baseline's kernels built into a cache of its own (as bench.steps and bench.kernels_ab build theirs)
    env = {"new": {}, "baseline": {} if baseline == this else {"DECODESCOPE_EXT_CACHE": str(baseline / ".ext-cache")}}
    runs = {name: [] for name in trees}
    for r in range(rounds):
        for name in (["new", "baseline"] if r % 2 == 0 else ["baseline", "new"]):
            runs[name].append(in_tree(trees[name], CHILD, [str(new_tokens)], dict(os.environ, **env[name]),
                                      what=f"the {name} tree's run"))
            print(name, {k: round(runs[name][-1][k], 3) for k in FIGURES}, flush=True)
    rows = []
    for fig in FIGURES:
        ratios = [a[fig] / b[fig] for a, b in zip(runs["new"], runs["baseline"], strict=True)]
        rows.append(dict(figure=fig, new=statistics.median(x[fig] for x in runs["new"]),
                         baseline=statistics.median(x[fig] for x in runs["baseline"]),
                         new_over_baseline=statistics.median(ratios), lo=min(ratios), hi=max(ratios)))
    same = all(a["ids"] == runs["new"][0]["ids"] for a in runs["new"] + runs["baseline"])
    return dict(rounds=rounds, new_tokens=new_tokens, baseline=str(baseline), format=runs["new"][0]["format"],
                same_ids=same, rows=rows, runs={k: [{f: x[f] for f in FIGURES} for x in v] for k, v in runs.items()})


def markdown(result: dict) -> str:
    p = result.get("provenance", {})
    tel = p.get("telemetry") or {}
    head = (f"Whole decoding of the default model ({result['format']}), this tree against {result['baseline']} "
            f"(baseline), {result['rounds']} rounds of fresh processes, the order turned each round; "
            f"{result['new_tokens']} new tokens a prompt; CPU: {tel.get('cpu_model', p.get('cpu', ''))}. Token ids "
            f"the same in every run: {result['same_ids']}. Medians over rounds; new_over_baseline: the median of "
            "the rounds' own ratios (lo / hi: their extremes).\n\n")
    return head + markdown_table(result["rows"], ["figure", "new", "baseline", "new_over_baseline", "lo", "hi"])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, type=Path, help="a source tree of the commit before the change")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--name", default="decode-ab")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    result = run(Path(__file__).resolve().parents[1], args.baseline.resolve(), args.rounds, args.new_tokens)
    result["provenance"] = provenance("cpu")
    write_results(args.out, args.name, result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
