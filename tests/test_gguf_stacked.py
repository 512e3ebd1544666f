"""A Q4_K_M-like file mixes block types inside a merged projection (its q and k in Q4_K, its v in Q6_K): every tensor
runs its own blocks, the merged weight stacked in a segment per type (engine/weights Stacked), with no second
rounding and nothing re-quantized kept in the model cache; an asked format still re-quantizes, and says so.

Tolerances: the fp32 load is the file's values (gguf's own dequantization, bit for bit: tests/test_gguf_inplace.py).
The file's blocks run against 8-bit activations per super-block of 256 (llama.cpp's Q8_K): within 0.25 of the
logits' spread of that, a bound that only catches a broken path (the blocks' exactness is checked directly). The
kernels and the twins run one recipe (engine/ops/ref.py), summed in another order: as tests/test_gguf_weights.py.
"""
import gguf
import pytest
import torch

from engine import Engine, load_model
from engine.checkpoint import gguf_convert
from engine.tiny import tiny_config, write_tiny_model
from stacked import dequantized

# Q4_K_M's mix: 4-bit K-quants, 6-bit for attn_v (so q/k/v are two segments), ffn_down and the head
Q4_K_M = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
          "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q4_K", "output": "Q6_K"}
IDS = list(range(3, 43))


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """qwen2: q/k/v biases, and no q/k row permutation, so the file's tensors are the rows the model runs."""
    from gguf_files import SHAPE, write_gguf

    root = tmp_path_factory.mktemp("stacked")
    folder = write_tiny_model(root / "hf", tiny_config("qwen2", **SHAPE), seed=3)
    write_gguf(folder, root / "m.gguf", Q4_K_M)
    return root / "m.gguf"


def load(path, cache, **kw):
    return load_model(path, cache_dir=cache, progress=lambda s: None, **kw)


def gguf_values(path) -> dict[str, torch.Tensor]:
    """Every tensor of the file as gguf's own dequantization makes it."""
    return {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy()).float()
            for t in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("fused", [True, False], ids=["kernels", "twins"])
def test_each_part_runs_its_own_blocks(gguf_file, tmp_path, fused):
    model = load(gguf_file, tmp_path, fused=fused)
    if fused and model.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    file = gguf_values(gguf_file)
    cfg = model.config
    for i, block in enumerate(model.layers):
        qkv, gate_up = block.attn.wqkv.weight, block.mlp.w_gate_up.weight
        assert [(s.fmt, s.out_features) for s in qkv.segments] == [("q4_k", cfg.q_size + cfg.kv_size),
                                                                   ("q6_k", cfg.kv_size)]
        parts = [file[f"blk.{i}.attn_{p}.weight"] for p in "qkv"]
        assert torch.equal(dequantized(qkv), torch.cat(parts)), i  # no second rounding: the file's values, bit for bit
        assert gate_up.fmt == "q4_k"  # one type: one segment, packed straight from the file's bytes
        assert torch.equal(dequantized(gate_up), torch.cat([file[f"blk.{i}.ffn_{p}.weight"] for p in ("gate", "up")]))
        assert (block.attn.wo.weight.fmt, block.mlp.w_down.weight.fmt) == ("q4_k", "q6_k")
    notes = " ".join(model.load_notes)
    assert "Q4_K as q4_k" in notes and "Q6_K as q6_k" in notes
    assert "second rounding" not in notes and "do not run" not in notes and "converted" not in notes
    want = Engine(load(gguf_file, tmp_path, weights="fp32"), 128).logits(IDS)
    got = Engine(model, 128).logits(IDS)
    assert (got - want).abs().max().item() <= 0.25 * want.std().item()


def test_the_kernels_and_the_twins_agree(gguf_file, tmp_path):
    fused = load(gguf_file, tmp_path)
    if fused.ops.name != "fused":
        pytest.skip("the CPU kernels do not run here")
    eng, twins = Engine(fused, 128), Engine(load(gguf_file, tmp_path, fused=False), 128)
    want = twins.logits(IDS)
    got = eng.logits(IDS)
    assert (got - want).abs().max().item() <= 0.05 * want.std().item()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    with torch.inference_mode():  # decode steps through the native block loop, then one verify pass: the same bits
        eng.prefill(IDS[:10])
        steps = torch.stack([eng.decode(torch.tensor([t]))[0] for t in IDS[10:27]])
        eng.rollback(10)
        chunk = eng.chunk(torch.tensor([IDS[10:27]]))[0]
    assert torch.equal(chunk, steps)


def test_the_model_cache_holds_no_weights(gguf_file, tmp_path):
    load(gguf_file, tmp_path)
    folder = gguf_convert.cached(gguf_file, tmp_path, progress=lambda s: None)
    assert not list(folder.glob("*.safetensors"))


def test_an_asked_format_still_rounds_again_and_says_so(gguf_file, tmp_path):
    model = load(gguf_file, tmp_path, weights="q6_k")
    assert {s.fmt for m in model.linears() for s in m.weight.segments} == {"q6_k"}
    notes = " ".join(model.load_notes)
    assert "re-quantized to q6_k from their dequantized values (weights='q6_k'): a second rounding" in notes
    assert "attn_q.weight (Q4_K)" in notes and "attn_v.weight" not in notes


def test_parts_ending_inside_a_panel_convert_a_chunk_at_a_time(tmp_path):
    """Loaded in another format, a merged projection is converted and packed a run of whole panels at a time
    (panels.block_runs): q's 32 rows, then k's 8 and v's 8 (one head each), so k's rows end inside a panel and
    are carried into v's. Every weight holds the values of the twins' load, which converts each part whole."""
    from gguf_files import write_gguf

    shape = dict(hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                 num_hidden_layers=2)
    mix = {"attn_q": "Q4_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_1", "ffn_gate": "Q8_0",
           "ffn_up": "Q4_0", "ffn_down": "Q5_0", "token_embd": "Q8_0", "output": "Q4_1"}
    folder = write_tiny_model(tmp_path / "hf", tiny_config("qwen2", **shape), seed=5)
    path = tmp_path / "m.gguf"
    write_gguf(folder, path, mix)
    for fmt in ("q4", "int8", "q5_0", "fp16"):
        want = load(path, tmp_path / "cache", weights=fmt, fused=False)
        got = load(path, tmp_path / "cache", weights=fmt)
        if got.ops.layout != "cpu":
            pytest.skip("the CPU kernels do not run here")
        assert got.layers[0].attn.wqkv.weight.out_features == 48
        for a, b in zip(want.linears(), got.linears(), strict=True):
            assert torch.equal(dequantized(a.weight), dequantized(b.weight)), fmt
