"""bench.verify_pace times steps and verify passes between probes of the vCPUs' pace (AVX-512 VNNI, g++ and the CPU
kernels): a sample per call with both probes and its ratios, each sample sorted by pace against the run's fastest
probe, and per T the medians over the samples each kind holds."""
import json

import pytest

from bench import verify_pace
from cpu_paths import needs_vnni_and


def test_classify_against_the_fastest_probe():
    samples = [dict(before={0: 10.0, 1: 11.0}, after={0: 10.5, 1: 10.0}),   # within 1.15x of 10: full
               dict(before={0: 10.0, 1: 14.0}, after={0: 10.0, 1: 10.0}),   # one probe 1.4x: contended
               dict(before={0: 12.0, 1: 12.0}, after={0: 12.0, 1: 12.0})]   # 1.2x: between
    verify_pace.classify(samples)
    assert [s["pace"] for s in samples] == ["full", "contended", "between"]
    assert samples[1]["worst_over_fastest"] == pytest.approx(1.4)
    for s, v in zip(samples, (1.1, 1.8, 1.5), strict=True):
        s.update(v6=v, step_ms=4.0)
    (row,) = verify_pace.summarize(samples, [6])
    assert (row["n_all"], row["n_full"], row["n_contended"]) == (3, 1, 1)
    assert (row["v_all"], row["v_full"], row["v_contended"]) == (1.5, 1.1, 1.8)


@needs_vnni_and("g++")
def test_a_short_run(tmp_path, cpu_module):
    verify_pace.main(["--rows", "3", "--samples", "2", "--repeats", "1", "--out", str(tmp_path), "--name", "vp"])
    result = json.loads((tmp_path / "vp.json").read_text())
    assert len(result["samples"]) == 2
    for s in result["samples"]:
        assert s["step_ms"] > 0 and s["verify3_ms"] > 0 and s["v3"] == pytest.approx(s["verify3_ms"] / s["step_ms"])
        assert set(s["before"]) == set(s["after"]) and all(v > 0 for v in s["before"].values())
        assert s["pace"] in ("full", "between", "contended") and s["worst_over_fastest"] >= 1
    (row,) = result["rows"]
    assert row["T"] == 3 and row["n_all"] == 2 and row["v_all"] > 0
    assert "full pace" in (tmp_path / "vp.md").read_text().lower()
