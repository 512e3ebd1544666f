"""bench/kv_cache.py on the default model, a quick grid: both caches timed at each context, and each cache's
quality against the exact model, the fp32 cache's top-1 against itself 1."""
import json

import pytest

from bench import kv_cache


@pytest.mark.slow
def test_kv_cache_bench_times_both_caches_and_judges_their_quality(tmp_path):
    kv_cache.main(["--contexts", "40", "80", "--rounds", "2", "--steps", "2", "--tokens", "64", "--formats", "q4",
                   "--out", str(tmp_path), "--name", "t"])
    result = json.loads((tmp_path / "t.json").read_text())
    assert [r["context"] for r in result["speed"]] == [40, 80]
    assert all(r["fp32_step_ms"] > 0 and r["fp16_step_ms"] > 0 and r["lo"] <= r["fp16_over_fp32"] <= r["hi"]
               for r in result["speed"])
    rows = {(r["text"], r["cache"]): r for r in result["quality"]}
    assert {cache for _, cache in rows} == {"fp32", "fp16"} and len(rows) == 4
    for (_, cache), r in rows.items():
        assert r["positions"] == 32 and 0 <= r["kl_vs_exact"] < 0.01 and r["top1_vs_exact"] > 0.9
        if cache == "fp32":  # q4 on the fp32 cache: the exact values, its logits within ~0.01 of theirs
            assert r["kl_vs_exact"] < 1e-3 and r["top1_vs_fp32_cache"] == 1
    assert "fp16_over_fp32" in (tmp_path / "t.md").read_text()
