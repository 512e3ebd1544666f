"""bench/load_memory.py's rows from scripted children (nothing is loaded or timed): every format of every target
measured once a repeat with the formats' order rotated, the peak the largest run's, the rest medians, and the peak
set against the files' bytes past a bare process. One real child loads the tiny model, so the figures it reports
are a load's."""
from __future__ import annotations

import pytest
import torch

from bench import load_memory


def test_rows_rotate_the_formats_and_take_the_largest_peak(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x" * 2_000_000)
    calls = []

    def in_child(path, fmt, decode=0):
        calls.append(fmt)
        n = len(calls)
        return dict(bare_mb=200.0, peak_mb=1000.0 + n, after_mb=600.0 + n, load_s=float(n), weights=[fmt],
                    kernels="fused", notes=[])

    monkeypatch.setattr(load_memory, "in_child", in_child)
    rows = load_memory.rows([("m", gguf)], ["q4", "int8", "fp32"], repeats=3)
    assert calls == ["q4", "int8", "fp32", "int8", "fp32", "q4", "fp32", "q4", "int8"]
    q4 = rows[0]
    assert (q4["format"], q4["file_mb"]) == ("q4", 2.0)
    assert q4["peak_mb_runs"] == [1001.0, 1006.0, 1008.0] and q4["peak_mb"] == 1008.0
    assert q4["after_mb"] == 606.0 and q4["load_s"] == 6.0 and q4["transient_mb"] == 402.0
    assert q4["peak_over_file"] == pytest.approx((1008 - 200) / 2.0)
    assert [r["format"] for r in rows] == ["q4", "int8", "fp32"]
    assert "peak_over_file" in load_memory.markdown(dict(repeats=3, rows=rows))


def test_a_folders_bytes_are_its_safetensors(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 300)
    (tmp_path / "b.safetensors").write_bytes(b"x" * 200)
    (tmp_path / "tokenizer.json").write_bytes(b"x" * 5000)
    assert load_memory.file_bytes(tmp_path) == 500


def test_a_child_reports_its_load(tmp_path):
    from engine.tiny import write_tiny_model

    folder = write_tiny_model(tmp_path / "tiny")
    got = load_memory.in_child(folder, "q4")
    assert got["peak_mb"] >= got["after_mb"] >= got["bare_mb"] > 50 and 0 < got["load_s"] < 60
    assert "q4" in got["weights"] and "decode_tok_s" not in got
    got = load_memory.in_child(folder, "default", decode=6)
    assert got["decode_tok_s"] > 0 and got["peak_after_decode_mb"] >= got["peak_mb"]


def test_a_random_folder_is_written_a_chunk_at_a_time_and_loads(tmp_path, monkeypatch):
    """The streamed safetensors hold every tensor the config needs, bf16, in the header's places: safetensors reads
    them, the norms near 1 and the rest near 0, and the folder loads as bf16 (its own dtype on the CPU kernels)."""
    from safetensors.torch import load_file

    from engine import load_model
    from engine.checkpoint.hf import expected_shapes
    from engine.tiny import tiny_config

    monkeypatch.setitem(load_memory.RANDOM, "tiny", dict(model_type="qwen2", like="a tiny model", hidden_size=64,
                                                         intermediate_size=96, num_hidden_layers=2))
    monkeypatch.setattr(load_memory, "CHUNK_BYTES", 1000)  # several chunks a tensor
    folder = load_memory.random_folder("tiny", tmp_path)
    assert load_memory.random_folder("tiny", tmp_path) == folder  # made once
    got = load_file(folder / "model.safetensors")
    cfg = tiny_config("qwen2", hidden_size=64, intermediate_size=96, num_hidden_layers=2)
    assert {n: tuple(t.shape) for n, t in got.items()} == expected_shapes(cfg)
    assert all(t.dtype == torch.bfloat16 for t in got.values())
    norm, proj = got["model.norm.weight"].float(), got["model.layers.1.mlp.down_proj.weight"].float()
    assert abs(norm.mean() - 1) < 0.1 and abs(proj.std() - 0.02) < 0.005 and len(proj.unique()) > 100
    model = load_model(folder, progress=lambda s: None)
    assert model.ops.name != "fused" or model.format == "bf16"


def test_nothing_to_load_is_refused(capsys):
    with pytest.raises(SystemExit):
        load_memory.main(["--formats", "q4"])
    assert "nothing to load" in capsys.readouterr().err
