"""bench/overlap.py: the three timings run the same calls (the cached one over one layer's tensors), and the ratios
are each round's own before the median."""
import json

import pytest

from bench import overlap
from engine.ops import ext


def test_ratios_are_taken_within_a_round_then_the_median():
    rounds = [dict(stream_T1=2.0, cached_T=4.0, stream_T=5.0, cached_T_one_thread=8.0, read_gb_s=10.0),  # 1.25, 5/6
              dict(stream_T1=3.0, cached_T=1.0, stream_T=3.0, cached_T_one_thread=2.0, read_gb_s=20.0),  # 1.0, 0.75
              dict(stream_T1=1.0, cached_T=1.0, stream_T=2.0, cached_T_one_thread=3.0, read_gb_s=30.0)]  # 2.0, 1.0
    row = overlap.summarize("q4_a8", 6, rounds, threads=2)
    assert row["over_max"] == 1.25 and row["over_max_lo"] == 1.0 and row["over_max_hi"] == 2.0
    assert row["over_sum"] == pytest.approx(5 / 6)
    assert row["cached_over_stream_T1"] == 1.0 and row["read_gb_s"] == 20.0
    assert (row["stream_T1_ms"], row["cached_T_ms"], row["stream_T_ms"]) == (2.0, 1.0, 3.0)
    blocks = overlap.blocks_per_pass()
    assert blocks == 30 * (60 * 18 + 36 * 18 + 192 * 18 + 36 * 48)  # the default model's four GEMMs a layer
    assert row["block_ns"] == pytest.approx(1e6 * 1.0 * 2 / blocks)
    assert row["block_ns_one_thread"] == pytest.approx(1e6 * 3.0 / blocks)


def test_one_thread_runs_on_one_and_puts_the_count_back():
    import torch
    seen = []
    before = torch.get_num_threads()
    overlap.one_thread(lambda: seen.append(torch.get_num_threads()))()
    assert seen == [1] and torch.get_num_threads() == before


def test_layer_calls_run_every_matrix_of_every_layer_in_order(monkeypatch):
    import torch
    calls = []

    class Module:
        def linear(self, y, x, code, panels):
            calls.append((tuple(y.shape), tuple(x.shape), code, panels))

    layers = [[f"L{i}M{j}" for j in range(len(overlap.LAYER_SHAPES))] for i in range(3)]
    overlap.layer_calls(Module(), 7, layers, 6, torch.Generator().manual_seed(0))()
    assert [c[3] for c in calls] == [p for layer in layers for p in layer]
    assert [c[0] for c in calls] == [(6, out) for _ in layers for out, _ in overlap.LAYER_SHAPES]
    assert [c[1] for c in calls] == [(6, n_in) for _ in layers for _, n_in in overlap.LAYER_SHAPES]
    assert {c[2] for c in calls} == {7}


@pytest.mark.skipif(ext.load("cpu").module is None, reason="the CPU kernels did not build")
def test_a_short_run_writes_a_row_per_format_and_T(tmp_path, monkeypatch):
    monkeypatch.setattr(overlap, "LAYERS", 2)
    overlap.main(["--formats", "q4_a8", "--rows", "3", "--rounds", "2", "--repeats", "1", "--out", str(tmp_path),
                  "--name", "o"])
    result = json.loads((tmp_path / "o.json").read_text())
    (row,) = result["rows"]
    assert row["format"] == "q4_a8" and row["T"] == 3 and row["stream_T_ms"] > 0 and row["over_max"] > 0
    assert len(result["raw"][0]["rounds"]) == 2 and result["provenance"]["device"] == "cpu"
