"""bench.pick on a small vocabulary: every path's row for both temperatures, positive times, the torch path its
own reference, and the result saved with its provenance."""
import json

from bench import pick


def test_pick_bench_rows(tmp_path):
    pick.main(["--vocab", "300", "--repeats", "2", "--picks", "3", "--out", str(tmp_path), "--name", "p"])
    result = json.loads((tmp_path / "p.json").read_text())
    rows = result["rows"]
    assert {(r["path"], r["temperature"]) for r in rows} >= {(p, t) for p in ("twins", "torch") for t in (0.0, 0.7)}
    assert all(r["us"] > 0 and len(r["rounds_us"]) == 2 for r in rows)
    assert all(r["vs_torch"] == 1 for r in rows if r["path"] == "torch")
    assert result["provenance"]["device"] == "cpu"
    assert "| 300 |" in (tmp_path / "p.md").read_text()


def test_the_paths_pick_the_same_tokens():
    """The paths differ in cost, not in what a greedy pick returns: the argmax, and its probability within the
    fp32 logsumexp's rounding."""
    import torch
    from types import SimpleNamespace

    from engine.engine import Engine
    from engine.sampling import Noise, SamplingParams

    logits = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 4
    got = []
    for logsumexp, fill in pick.paths().values():
        eng = SimpleNamespace(model=SimpleNamespace(ops=SimpleNamespace(logsumexp=logsumexp)))
        got.append(Engine.pick(eng, logits, SamplingParams(0.0), Noise(0, "cpu", fill)))
    assert len({tok for tok, _ in got}) == 1
    assert max(p for _, p in got) - min(p for _, p in got) <= 1e-5 * max(p for _, p in got)
