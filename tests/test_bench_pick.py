"""bench.pick on a small vocabulary: every path's row for each setting (greedy, temperature, top-p, top-k), positive
times, the torch path its own reference, and the result saved with its provenance."""
import json

from bench import pick


def test_pick_bench_rows(tmp_path):
    pick.main(["--vocab", "300", "--repeats", "2", "--picks", "3", "--out", str(tmp_path), "--name", "p"])
    result = json.loads((tmp_path / "p.json").read_text())
    rows = result["rows"]
    settings = {(0.0, 1.0, 0), (0.7, 1.0, 0), (0.7, 0.9, 0), (0.7, 1.0, 40)}
    assert {(r["path"], r["temperature"], r["top_p"], r["top_k"]) for r in rows} >= {
        (p, *s) for p in ("twins", "torch") for s in settings}
    assert all(r["us"] > 0 and len(r["rounds_us"]) == 2 for r in rows)
    assert all(r["vs_torch"] == 1 for r in rows if r["path"] == "torch")
    assert result["provenance"]["device"] == "cpu"
    assert "| 300 |" in (tmp_path / "p.md").read_text()


def test_the_paths_pick_the_same_tokens():
    """The paths differ in cost, not in what a greedy pick returns: the argmax, and its probability within the
    fp32 logsumexp's rounding."""
    import torch

    from engine.sampling import SamplingParams

    logits = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 4
    got = [pick_fn(logits, SamplingParams(0.0), pick.noise(ops, 0)) for pick_fn, ops in pick.paths().values()]
    assert len({tok for tok, _ in got}) == 1
    assert max(p for _, p in got) - min(p for _, p in got) <= 1e-5 * max(p for _, p in got)
    sampled = SamplingParams(0.7, seed=3)  # at T > 0 the kernels' and twins' rows are the same uniforms
    kernels_and_twins = [pick.paths()[name] for name in ("kernels", "twins") if name in pick.paths()]
    draws = [[pick_fn(logits, sampled, pick.noise(ops, 3).at(i))[0] for i in range(50)]
             for pick_fn, ops in kernels_and_twins]
    assert all(d == draws[0] for d in draws)
