"""bench.tile_pace compiles gemm.h's tiles into its driver and times them (on a CPU with AVX-512 VNNI and g++): a row
per format, T and regime, positive times, T's own reference at 1, more rows costing more in L2, and the result saved
with its provenance."""
import json

from bench import tile_pace
from cpu_paths import needs_vnni_and


@needs_vnni_and("g++")
def test_tile_pace_rows(tmp_path):
    tile_pace.main(["--rows", "1", "16", "--rounds", "1", "--repeats", "1", "--stream-mb", "4", "--out", str(tmp_path),
                    "--name", "t"])
    result = json.loads((tmp_path / "t.json").read_text())
    rows = result["rows"]
    assert [(r["format"], r["T"], r["regime"]) for r in rows] == [
        (f, T, g) for f in tile_pace.FORMATS for T in (1, 16) for g in tile_pace.REGIMES]
    assert all(r["ns_per_block"] > 0 for r in rows)
    assert all(r["over_T1"] == 1 for r in rows if r["T"] == 1)
    # 16 rows are 16 times the dot products of one: in L2, where nothing waits on memory, they cost more
    assert all(r["over_T1"] > 2 for r in rows if r["T"] == 16 and r["regime"] == "l2")
    assert result["provenance"]["device"] == "cpu" and len(result["raw"]) == 1
