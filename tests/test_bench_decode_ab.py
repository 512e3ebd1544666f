"""bench.decode_ab on a few tokens: a tree against itself gives the same ids, every figure for both trees, and
ratios from the pairs' own runs; a baseline whose greedy tokens differ is reported as such."""
import json
import subprocess
from pathlib import Path

import pytest

from bench import decode_ab

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # two processes load the default model
def test_a_tree_against_itself(tmp_path):
    decode_ab.main(["--baseline", str(ROOT), "--sessions", "1", "--rounds", "1", "--new-tokens", "4", "--out",
                    str(tmp_path), "--name", "ab"])
    result = json.loads((tmp_path / "ab.json").read_text())
    assert result["same_ids"] is True and result["format"]
    assert result["baseline_commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                                       text=True).stdout.strip()
    assert [(r["mode"], r["figure"]) for r in result["rows"]] == [
        ("plain", "tok_s"), ("plain", "pick_ms"), ("top_p", "tok_s"), ("top_p", "pick_ms"), ("ngram", "tok_s"),
        ("ngram_top_p", "tok_s")]
    for row in result["rows"]:
        pairs = [p["new"][row["figure"]] / p["baseline"][row["figure"]] for p in result["pairs"][row["mode"]]]
        assert row["pairs"] == len(pairs) == 4 and row["lo"] == min(pairs) and row["hi"] == max(pairs)
        assert row["new"] > 0 and row["baseline"] > 0
    assert "Token ids the same in every pair: True" in (tmp_path / "ab.md").read_text()


class FakeTree:
    """A tree's process answering every prompt with the same figures; the baseline's ids differ in one prompt."""

    started: list = []

    def __init__(self, tree, new_tokens, env):
        self.baseline = tree != ROOT
        FakeTree.started.append("baseline" if self.baseline else "new")
        self.info = dict(format="q4", prompts={"plain": 2, "top_p": 2, "ngram": 1, "ngram_top_p": 1})

    def run(self, mode, i):
        ids = [1, 3] if self.baseline and (mode, i) == ("plain", 1) else [1, 2]
        return dict(tok_s=100.0 if self.baseline else 110.0, pick_ms=0.1 if self.baseline else 0.05, ids=ids)

    def close(self):
        pass


def test_a_baseline_with_other_tokens_says_so(monkeypatch):
    """Sessions start the two trees in turn; every pair of every session counts."""
    FakeTree.started = []
    monkeypatch.setattr(decode_ab, "Tree", FakeTree)
    result = decode_ab.run(ROOT, ROOT / "before", rounds=2, new_tokens=2, sessions=2)
    assert FakeTree.started == ["new", "baseline", "baseline", "new"]
    assert result["same_ids"] is False
    assert {r["mode"]: r["same_ids"] for r in result["rows"]} == dict(plain=False, top_p=True, ngram=True,
                                                                      ngram_top_p=True)
    ratios = {(r["mode"], r["figure"]): (r["new_over_baseline"], r["pairs"]) for r in result["rows"]}
    assert ratios == {("plain", "tok_s"): (pytest.approx(1.1), 8), ("plain", "pick_ms"): (0.5, 8),
                      ("top_p", "tok_s"): (pytest.approx(1.1), 8), ("top_p", "pick_ms"): (0.5, 8),
                      ("ngram", "tok_s"): (pytest.approx(1.1), 4), ("ngram_top_p", "tok_s"): (pytest.approx(1.1), 4)}
    assert result["baseline_commit"] is None  # no git checkout there


def test_each_tree_sets_its_own_openmp_defaults(monkeypatch):
    """A child gets the user's environment, not this process's (where `import engine` set its OpenMP defaults): a
    baseline from before a change to those defaults must run with its own."""
    import io

    import engine

    seen = {}

    class Popen:
        def __init__(self, cmd, env, **kw):
            seen.update(env)
            self.stdout, self.stdin = io.StringIO('{"format": "q4", "prompts": {}}\n'), io.StringIO()

    monkeypatch.setattr(decode_ab.subprocess, "Popen", Popen)
    monkeypatch.setattr(engine, "USER_OPENMP", dict.fromkeys(engine.OPENMP_DEFAULTS))
    for name, value in engine.OPENMP_DEFAULTS.items():
        monkeypatch.setenv(name, value)
    decode_ab.Tree(ROOT, 4, {})
    assert not set(engine.OPENMP_DEFAULTS) & set(seen) and seen["PYTHONPATH"] == str(ROOT)


def test_a_baseline_trees_commit_and_whether_it_changed(tmp_path):
    """tree_commit names the tree's commit; an edit to its code makes it dirty, the benchmarks' own writes in it
    (bench/results/, the kernels built into .ext-cache/) do not; a folder outside git says nothing."""
    from bench.common import tree_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "engine.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert tree_commit(tmp_path) == (head, False)
    (tmp_path / ".ext-cache").mkdir()
    (tmp_path / ".ext-cache" / "k.so").write_text("")
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "r.json").write_text("{}")
    assert tree_commit(tmp_path) == (head, False)
    (tmp_path / "engine.py").write_text("x = 2\n")
    assert tree_commit(tmp_path) == (head, True)
    assert tree_commit(tmp_path / "nowhere") == (None, None)
