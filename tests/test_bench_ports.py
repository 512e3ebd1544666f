"""bench.ports compiles and runs its mixes (on a CPU with AVX-512 VNNI and gcc): one row each, positive times, the
dot-product rows their own reference, and the result saved with its provenance."""
import json
import shutil
from pathlib import Path

import pytest

from bench import ports


def has_vnni() -> bool:
    try:
        return "avx512_vnni" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.skipif(not has_vnni() or shutil.which("gcc") is None, reason="needs AVX-512 VNNI and gcc")
def test_ports_rows(tmp_path):
    ports.main(["--iters", "2000", "--repeats", "1", "--out", str(tmp_path), "--name", "p"])
    result = json.loads((tmp_path / "p.json").read_text())
    rows = result["rows"]
    assert [r["mix"] for r in rows] == [m[0] for m in ports.MIXES]
    assert all(r["ns_per_iter"] > 0 for r in rows)
    assert all(r["extra_ns"] == 0 for r, m in zip(rows, ports.MIXES, strict=True) if not m[3])
    assert [r["vpdpbusd"] for r in rows] == [m[1] * m[2] for m in ports.MIXES]
    assert {r["chains"] for r in rows} == {6, 12}
    assert result["q4_block_memory_ns"] > 0 and result["provenance"]["device"] == "cpu"
