"""bench/quantizer_error.py: the random weights are made again as the file was written, and each tensor's stored
blocks are compared with our quantizer's on them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bench import quantizer_error, random_gguf
from engine import weights

TINY = dict(like="a test", hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, tied=True, rope_theta=1e4,
            vocab=300)


def write_file(path, stored):
    """A GGUF holding layer 0's projections of TINY as `stored(name, w)` makes their blocks (w: the random weights
    as the F16 file held them, llama.cpp's q/k row order), in Q2_K, and layer 1's norms only."""
    import gguf

    w = gguf.GGUFWriter(path, "llama")
    for i, (name, dims, role, heads) in enumerate(random_gguf.hf_tensors(TINY, TINY["vocab"])):
        if not name.startswith("blk.0.") or role != "linear":
            continue
        t = random_gguf.file_tensor(i, dims, role, heads)
        raw = stored(name, torch.from_numpy(t.astype(np.float16).astype(np.float32)))
        w.add_tensor(name, raw.numpy(), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def tiny_shape(monkeypatch):
    monkeypatch.setitem(random_gguf.BIG_SHAPES, "tiny", TINY)


def test_our_own_blocks_in_the_file_measure_level(tmp_path, tiny_shape):
    """A file whose blocks are our quantizer's: every tensor's error equals ours exactly, ratio 1."""
    path = tmp_path / "ours.gguf"
    write_file(path, lambda name, w: weights.get("q2_k").to_gguf(weights.quantize(w, "q2_k")))
    rows = quantizer_error.tensor_errors(path, "tiny", [0])
    assert [r["tensor"] for r in rows] == [f"blk.0.{n}.weight" for n in
                                           ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                            "ffn_down")]
    assert all(r["ours"] == r["llamacpp"] > 0 for r in rows)
    (t,) = quantizer_error.by_type(rows)
    assert (t["type"], t["format"], t["tensors"]) == ("Q2_K", "q2_k", 7)
    assert t["ours_over_llamacpp"] == 1.0 and t["ours_over_llamacpp_weighted"] == 1.0


def test_other_blocks_and_other_weights_show(tmp_path, tiny_shape):
    """Blocks of a cruder quantizer (every sub-block's step on its full range, no search) err more than ours; and a
    file made from other weights than the ones the bench makes again would show as a large error."""
    def crude(name, w):
        b = weights.quantize(w, "q2_k")
        x = w.view(w.shape[0], -1, 16)
        lo, hi = x.amin(-1).clamp(max=0), x.amax(-1)
        b.q = torch.round((x - lo[..., None]) / ((hi - lo) / 3)[..., None]).clamp(0, 3).to(torch.uint8).view_as(b.q)
        return weights.get("q2_k").to_gguf(b)

    path = tmp_path / "crude.gguf"
    write_file(path, crude)
    (t,) = quantizer_error.by_type(quantizer_error.tensor_errors(path, "tiny", [0]))
    assert t["ours_over_llamacpp"] < 0.9
    path = tmp_path / "other.gguf"
    write_file(path, lambda name, w: weights.get("q2_k").to_gguf(weights.quantize(w.flip(1), "q2_k")))
    (t,) = quantizer_error.by_type(quantizer_error.tensor_errors(path, "tiny", [0]))
    assert t["llamacpp_rel_rms"] > 1.0 and t["ours_rel_rms"] < 0.3
