"""bench.kernels_ab on small shapes: a tree against itself gives the same bits and both trees' timings; a baseline
whose GEMM outputs differ is reported as such (its weights perturbed in Python, so no second build is needed), its
attention and nucleus, which no weight enters, as equal."""
import json
import shutil
from pathlib import Path

import pytest

from bench import kernels_ab

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(kernels_ab, "STREAM_SHAPES", [(64, 256), (48, 512)])
    monkeypatch.setattr(kernels_ab, "COMPUTE_SHAPE", (64, 256))
    monkeypatch.setattr(kernels_ab, "PROLOGUE_SHAPE", (16, 96))
    monkeypatch.setattr(kernels_ab, "LAYER_SHAPES", [(48, 64), (32, 96)])
    monkeypatch.setattr(kernels_ab, "ATTENTION_RUNS", [("one thread, context 64, 2 layers", 1, (9, 3, 64), 2, 64),
                                                       ("{threads} threads, head dim 128, context 200, 2 layers", 0,
                                                        (12, 2, 128), 2, 200)])
    monkeypatch.setattr(kernels_ab, "PICK_VOCABS", (1000,))


def copy_tree(dst: Path) -> Path:
    for name in ("engine", "bench", "csrc"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
    return dst


def run(tmp_path: Path, baseline: Path) -> dict:
    kernels_ab.main(["--baseline", str(baseline), "--kernels", "int8", "attention", "nucleus", "--rows", "1", "6",
                     "--rounds", "1",
                     "--repeats", "1", "--layers", "1", "--out", str(tmp_path / "out"), "--name", "ab"])
    return json.loads((tmp_path / "out" / "ab.json").read_text())


def test_a_tree_against_itself(tmp_path, small):
    result = run(tmp_path, copy_tree(tmp_path / "same"))
    timed = [r for r in result["rows"] if "T" in r]
    for kernel, timings in (("int8", 4), ("attention", 2), ("nucleus", 2)):  # nucleus: top-p and top-k
        rows = [r for r in timed if r["kernel"] == kernel]
        assert sorted(r["T"] for r in rows) == [1] * timings + [6] * timings
        assert len({r["timing"] for r in rows}) == timings
    assert all(r["bits_equal"] and r["new"] > 0 and r["baseline"] > 0 and r["new_over_baseline"] > 0 for r in timed)
    assert result["provenance"]["device"] == "cpu"
    assert "| int8 |" in (tmp_path / "out" / "ab.md").read_text()


def test_different_outputs_are_reported(tmp_path, small):
    tree = copy_tree(tmp_path / "other")
    with open(tree / "engine" / "weights" / "__init__.py", "a") as f:  # the baseline quantizes other weights
        f.write("\n_quantize = quantize\n\n\ndef quantize(w, *a, **k):\n    return _quantize(w * 1.5, *a, **k)\n")
    result = run(tmp_path, tree)
    assert not any(r["bits_equal"] for r in result["rows"] if r.get("kernel") == "int8" and "T" in r)
    assert all(r["bits_equal"] for r in result["rows"] if r.get("kernel") in ("attention", "nucleus") and "T" in r)
