"""bench.vcpus times the same pinned work on every CPU, alone and together (on a CPU with AVX-512 VNNI and g++): a row
a round with a time per CPU, the fastest named, the slowest-over-fastest ratio at least 1, and the result saved."""
import json
import os

import pytest

from bench import vcpus
from cpu_paths import needs_vnni_and


@needs_vnni_and("g++")
def test_vcpus_rounds(tmp_path):
    vcpus.main(["--rounds", "2", "--repeats", "1", "--pause", "0", "--out", str(tmp_path), "--name", "v"])
    result = json.loads((tmp_path / "v.json").read_text())
    cpus = sorted(os.sched_getaffinity(0))
    assert result["cpus"] == cpus and len(result["rows"]) == 2
    for row in result["rows"]:
        times = [row[f"cpu{c}_ns"] for c in cpus]
        assert all(t > 0 for t in times) and all(row[f"cpu{c}_together_ns"] > 0 for c in cpus)
        assert row["fastest_cpu"] in cpus and row[f"cpu{row['fastest_cpu']}_ns"] == min(times)
        assert row["slowest_over_fastest"] == pytest.approx(max(times) / min(times))
        assert all(row[f"cpu{c}_steal_ms"] >= 0 for c in cpus)
    assert sum(result["rounds_fastest"].values()) == 2
    assert "slowest over fastest" in (tmp_path / "v.md").read_text().lower()
