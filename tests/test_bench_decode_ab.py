"""bench.decode_ab on a few tokens: a tree against itself gives the same ids, every figure for both trees, and
ratios from the rounds' own pairs; a baseline whose greedy tokens differ is reported as such."""
import json
from pathlib import Path

import pytest

from bench import decode_ab

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # two processes load the default model
def test_a_tree_against_itself(tmp_path):
    decode_ab.main(["--baseline", str(ROOT), "--rounds", "2", "--new-tokens", "4", "--out", str(tmp_path),
                    "--name", "ab"])
    result = json.loads((tmp_path / "ab.json").read_text())
    assert result["same_ids"] is True and result["rounds"] == 2 and result["format"]
    assert [r["figure"] for r in result["rows"]] == list(decode_ab.FIGURES)
    for row in result["rows"]:
        pairs = [n[row["figure"]] / b[row["figure"]] for n, b in zip(result["runs"]["new"],
                                                                       result["runs"]["baseline"], strict=True)]
        assert row["lo"] == min(pairs) and row["hi"] == max(pairs) and row["new"] > 0 and row["baseline"] > 0
    assert "Token ids the same in every run: True" in (tmp_path / "ab.md").read_text()


def test_a_baseline_with_other_tokens_says_so(monkeypatch):
    """The ids compared are every run's, so one changed token in one run of either tree turns same_ids False."""
    runs = iter([dict(format="q4", ids=[[1, 2]], **{f: 1.0 for f in decode_ab.FIGURES}),
                 dict(format="q4", ids=[[1, 3]], **{f: 2.0 for f in decode_ab.FIGURES})])
    monkeypatch.setattr(decode_ab, "in_tree", lambda *a, **k: next(runs))
    result = decode_ab.run(ROOT, ROOT, rounds=1, new_tokens=2)
    assert result["same_ids"] is False
    assert all(r["new_over_baseline"] == 0.5 for r in result["rows"])
