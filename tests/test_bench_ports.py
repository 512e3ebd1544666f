"""bench.ports compiles and runs its mixes (on a CPU with AVX-512 VNNI and gcc): one row each, positive times, the
dot-product rows their own reference, and the result saved with its provenance."""
import json

from bench import ports
from cpu_paths import needs_vnni_and


@needs_vnni_and("gcc")
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
