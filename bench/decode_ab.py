"""Two source trees' whole decoding on the default model, as a user runs it: a change to the step or the pick and
the commit before it.

    python -m bench.decode_ab --baseline /tmp/before [--sessions 4] [--rounds 5] [--name decode-ab-<change>]

Two builds of the extension cannot share a process, and the box's read bandwidth moves by a third within minutes,
so fresh processes minutes apart compare two machines. Here each tree runs in a process of its own, kept for a
session (the model loaded and warmed up once), and the two take turns prompt by prompt, the order turned every
turn, as bench.paired_decode's engines do: each pair of runs of one prompt lies within a second or two and gives
its own ratio. A process started first ran 1.4-2.8% slower than a twin of the same tree started after it (80
pairs), so sessions start the two in turn. Prompts: plain decoding through Engine.generate over the open prompts
of bench.spec_open (held-out half), greedy (`plain`) and sampled at temperature 0.7 with top-p 0.9 (`top_p`, the
seed each prompt's length), and n-gram speculative decoding at the page's k over the copy set
(bench/data/spec-edit.txt), greedy (`ngram`) and sampled as `top_p` (`ngram_top_p`: its verify passes judge k + 1
rows), 96 new tokens each, in the launch format. Per run: decode tok/s (tokens after the first over their time) and,
for plain decoding, the pick (Round.sample_ms, median). The table gives each tree's median and the median of the
pairs' own new / baseline ratios (lo / hi: their extremes), and whether both trees gave the same token ids in every
pair of a mode (greedy: a change to the pick that moves a token is a bug, not a speed-up; sampled: a token can move
where a race is decided by a probability's last bit, and the change says why).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import markdown_table, provenance, tree_commit, write_results
from engine.endpoint.llamacpp import clean_env

# One tree's process: loads, warms up, then runs the prompt each stdin line names ("plain 3", "ngram 0") and prints
# its figures as one JSON line. Run with that tree first on sys.path.
CHILD = r"""
import json, statistics, sys
import engine  # noqa: F401  (OpenMP's wait policy before torch loads)
from engine import Engine, Tokenizer, load_model, speculative
from engine.request import Request
from bench.spec import read_set
from bench.spec_open import open_prompts
n = int(sys.argv[1])
model = load_model(None, device="cpu", progress=lambda msg: None)
tok = Tokenizer(model.path)
open_set = [tok.encode_chat(t) for t in open_prompts(tok, 8)[1::2]]
copy_set = [tok.encode_chat(t) for t in list(read_set("edit").values())[:4]]
prompts = {"plain": open_set, "top_p": open_set, "ngram": copy_set, "ngram_top_p": copy_set}
eng = Engine(model, max_seq_len=max(len(p) for ps in prompts.values() for p in ps) + max(n, 16) + 8)
def run(mode, p, n):
    if mode == "plain":
        return eng.generate(p, n, stop_ids=[])
    if mode == "top_p":
        return eng.generate(p, n, temperature=0.7, top_p=0.9, seed=len(p), stop_ids=[])
    sampled = dict(temperature=0.7, top_p=0.9, seed=len(p)) if mode == "ngram_top_p" else {}
    return speculative.generate(eng, speculative.NgramDrafter(max_n=3), p, k=Request().k, max_new_tokens=n,
                                stop_ids=[], **sampled)
for mode, ps in prompts.items():
    run(mode, ps[0], 16)
print(json.dumps(dict(format=model.weight_format, prompts={m: len(ps) for m, ps in prompts.items()})), flush=True)
for line in sys.stdin:
    mode, i = line.split()
    ids, stats = run(mode, prompts[mode][int(i)], n)
    r = stats.rounds
    print(json.dumps(dict(tok_s=1e3 * (len(ids) - 1) / (r[-1].t_end_ms - r[0].t_end_ms),
                          pick_ms=statistics.median(x.sample_ms for x in r[1:]), ids=ids)), flush=True)
"""
MODES = ("plain", "top_p", "ngram", "ngram_top_p")


class Tree:
    """One source tree's process; run(mode, i) -> its figures for prompt i."""

    def __init__(self, tree: Path, new_tokens: int, env: dict):
        # the user's environment, not this process's: each tree's `import engine` sets its own OpenMP defaults
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(new_tokens)], cwd=tree, text=True,
                                     env=dict(clean_env(), PYTHONPATH=str(tree), **env), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.tree = tree
        self.info = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the run in {self.tree} ended early (its stderr is above)")
        return json.loads(line)

    def run(self, mode: str, i: int) -> dict:
        self.proc.stdin.write(f"{mode} {i}\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def run(this: Path, baseline: Path, rounds: int, new_tokens: int, sessions: int = 4) -> dict:
    """`sessions` pairs of processes, started in turn (the new tree's first, then the baseline's first: the process
    started first ran 1.4-2.8% slower than its twin of the same tree over 80 pairs), each `rounds` rounds."""
    # the baseline's kernels built into a cache of its own (as bench.steps and bench.kernels_ab build theirs)
    dirs = {"new": (this, {}), "baseline": (baseline, {} if baseline == this else
                                            {"DECODESCOPE_EXT_CACHE": str(baseline / ".ext-cache")})}
    pairs, info = {m: [] for m in MODES}, {}
    for session in range(sessions):
        trees = {}
        try:
            for name in ("new", "baseline") if session % 2 == 0 else ("baseline", "new"):
                tree, env = dirs[name]
                trees[name] = Tree(tree, new_tokens, env)
            info = trees["new"].info
            turn = 0
            for _ in range(rounds):
                for mode in MODES:
                    for i in range(info["prompts"][mode]):
                        order = ["new", "baseline"] if turn % 2 == 0 else ["baseline", "new"]
                        turn += 1
                        pairs[mode].append({name: trees[name].run(mode, i) for name in order})
                print(session, {m: len(p) for m, p in pairs.items()}, flush=True)
        finally:
            for t in trees.values():
                t.close()
    rows = []
    for mode in MODES:
        same = all(p["new"]["ids"] == p["baseline"]["ids"] for p in pairs[mode])
        for fig in ("tok_s",) if mode.startswith("ngram") else ("tok_s", "pick_ms"):
            ratios = [p["new"][fig] / p["baseline"][fig] for p in pairs[mode]]
            rows.append(dict(mode=mode, figure=fig, new=statistics.median(p["new"][fig] for p in pairs[mode]),
                             baseline=statistics.median(p["baseline"][fig] for p in pairs[mode]),
                             new_over_baseline=statistics.median(ratios), lo=min(ratios), hi=max(ratios),
                             new_ahead_pct=100 * sum(r > 1 for r in ratios) / len(ratios), pairs=len(ratios),
                             same_ids=same))
    commit, dirty = tree_commit(baseline)
    return dict(sessions=sessions, rounds=rounds, new_tokens=new_tokens, baseline=str(baseline),
                baseline_commit=commit, baseline_dirty=dirty, format=info["format"],
                same_ids=all(r["same_ids"] for r in rows), rows=rows,
                pairs={m: [{n: {k: v for k, v in r.items() if k != "ids"} for n, r in p.items()} for p in ps]
                       for m, ps in pairs.items()})


def markdown(result: dict) -> str:
    p = result.get("provenance", {})
    tel = p.get("telemetry") or {}
    base = result.get("baseline_commit") or result["baseline"]
    if result.get("baseline_dirty"):
        base += " with uncommitted changes"
    head = (f"Whole decoding of the default model ({result['format']}), this tree against {base} "
            f"(baseline), one process each taking turns prompt by prompt, {result['sessions']} pairs of processes "
            f"(started new first, then baseline first) of {result['rounds']} rounds each; "
            f"{result['new_tokens']} new tokens a prompt; CPU: {tel.get('cpu_model', p.get('cpu', ''))}. Token ids "
            f"the same in every pair: {result['same_ids']}. Medians; new_over_baseline: the median of the pairs' "
            "own ratios (lo / hi: their extremes; new_ahead_pct: the pairs whose ratio is above 1); same_ids: "
            "whether the mode's token ids were the same in every pair.\n\n")
    return head + markdown_table(result["rows"], ["mode", "figure", "new", "baseline", "new_over_baseline", "lo",
                                                  "hi", "new_ahead_pct", "pairs", "same_ids"])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, type=Path, help="a source tree of the commit before the change")
    p.add_argument("--sessions", type=int, default=4, help="pairs of processes, started in turn")
    p.add_argument("--rounds", type=int, default=5, help="rounds over the prompts in each session")
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--name", default="decode-ab")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    result = run(Path(__file__).resolve().parents[1], args.baseline.resolve(), args.rounds, args.new_tokens,
                 args.sessions)
    result["provenance"] = provenance("cpu")
    write_results(args.out, args.name, result, markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
