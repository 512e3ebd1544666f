"""The GGUF block types' records (engine/weights/: q8_0, q4_1, q4_0, k_quants): each codec reads and writes
GGUF's bytes, each dequantize twin gives gguf's own dequantization bit for bit (random blocks, awkward row
counts, and the embedded Gemma 3 file's real tensors), the quantizers stay on their grids, Q4_0 / Q5_0 blocks
are int8 blocks exactly, and the formats without a CPU kernel run on their twins and are refused on the kernels
by name."""
import numpy as np
import pytest
import torch

from engine import Engine, ModelLoadError, load_model, weights
from engine.tiny import tiny_config, write_tiny_model

GGUF_FORMATS = [name for name, f in weights.REGISTRY.items() if f.from_gguf and f.pickable]


def gguf_dequantize(raw: torch.Tensor, gtype: str, out: int, n_in: int) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    return quants.dequantize(raw.numpy(), getattr(GGMLQuantizationType, gtype)).reshape(out, n_in)


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
@pytest.mark.parametrize("out, n_in", [(1, 256), (17, 512), (5, 768)])
def test_twin_and_codec_match_gguf(fmt, out, n_in):
    f = weights.get(fmt)
    w = torch.randn(out, n_in, generator=torch.Generator().manual_seed(out * n_in)) * 3
    w[0, :64] = 0  # whole zero blocks and sub-blocks: a zero scale
    b = f.quantize(w)
    raw = f.to_gguf(b)
    assert raw.dtype == torch.uint8 and raw.shape == (out, f.nbytes(1, n_in))
    assert np.array_equal(weights.dequantize(b).numpy(), gguf_dequantize(raw, f.gguf, out, n_in))
    back = f.from_gguf(raw, out, n_in)
    assert all(torch.equal(x, y) for x, y in zip(back.tensors, b.tensors, strict=True))


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_decoding_arbitrary_bytes_matches_gguf(fmt):
    """Bytes no quantizer of ours would write (every bit pattern of the quants and sub-scales), with finite
    fp16 scales: the decoder and the twin still agree with gguf."""
    f = weights.get(fmt)
    out, n_in = 6, 512
    raw = torch.randint(0, 256, (out, f.nbytes(1, n_in)), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    b = f.from_gguf(raw, out, n_in)
    fixed = f.to_gguf(weights.Blocks(b.fmt, out, n_in, b.q, *(torch.rand_like(t.float()).half() if t is not None
                                                              else None for t in (b.d, b.m)), b.sc, b.mn))
    b = f.from_gguf(fixed, out, n_in)
    assert np.array_equal(weights.dequantize(b).numpy(), gguf_dequantize(fixed, f.gguf, out, n_in))


# (inputs per step-setting block, how a block's step follows from its values)
STEPS = {"q4_0": (32, lambda x: x.abs().amax(-1) / 8), "q5_0": (32, lambda x: x.abs().amax(-1) / 16),
         "q5_1": (32, lambda x: (x.amax(-1) - x.amin(-1)) / 31),
         "q2_k": (16, lambda x: (x.amax(-1) - x.amin(-1).clamp(max=0)) / 3),
         "q3_k": (16, lambda x: x.abs().amax(-1) / 4),
         "q4_k": (32, lambda x: (x.amax(-1) - x.amin(-1).clamp(max=0)) / 15),
         "q5_k": (32, lambda x: (x.amax(-1) - x.amin(-1).clamp(max=0)) / 31),
         "q6_k": (16, lambda x: x.abs().amax(-1) / 32)}


@pytest.mark.parametrize("fmt", STEPS)
def test_quantizers_round_to_their_grids(fmt):
    """Rounding to a grid of step s errs by s / sqrt(12) RMS; the steps here are each block's (sub-block's) own,
    so the bound follows the weights. 1.25x that leaves room for the K-quants' 6- and 8-bit sub-scales, which
    round each sub-block's step by up to half a unit of the super-block's."""
    w = torch.randn(64, 1024, generator=torch.Generator().manual_seed(3))
    size, step = STEPS[fmt]
    expected = (step(w.view(64, -1, size)) ** 2).mean().sqrt() / 12 ** 0.5
    err = weights.dequantize(weights.quantize(w, fmt)) - w
    assert err.pow(2).mean().sqrt() <= 1.25 * expected


@pytest.mark.parametrize("fmt", ["q4_0", "q5_0"])
def test_legacy_blocks_are_int8_blocks_exactly(fmt):
    b = weights.quantize(torch.randn(8, 96), fmt)
    for into in ("int8", "q8"):
        same = weights.reblock(b, into)
        assert same.fmt == into and torch.equal(weights.dequantize(same), weights.dequantize(b))
    assert weights.reblock(b, "q4") is None and weights.reblock(weights.quantize(torch.randn(8, 256), "q4_k"),
                                                                 "int8") is None


@pytest.mark.parametrize("fmt", ["q4_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"])
def test_gguf_formats_run_on_their_kernels_or_twins(tmp_path, fmt):
    cfg = tiny_config(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
    folder = write_tiny_model(tmp_path / "m", cfg)
    ids = list(range(3, 30))
    want = Engine(load_model(folder, weights="fp32"), 64).logits(ids)
    model = load_model(folder, weights=fmt, fused=False)
    assert model.weight_format == fmt and model.layers[0].mlp.w_down.weight.fmt == fmt
    got = Engine(model, 64).logits(ids)
    # 4-6 bit rounding of random weights moves random logits about as much as their spread (3-bit, twice the
    # step, a little more; 2-bit, twice that again): the bound only catches a broken path (the blocks' exactness is
    # test_kept_k_quant_blocks_run_on_their_twins's)
    spread = {"q2_k": 8, "q3_k": 5}.get(fmt, 3)
    assert torch.isfinite(got).all() and (got - want).abs().max().item() <= spread * want.std().item()
    if load_model(folder).ops.name != "fused":
        return
    if "cpu" not in weights.get(fmt).layouts:
        with pytest.raises(ModelLoadError, match=f"weights='{fmt}' has no CPU kernel; its torch twin runs it with "
                                                 r"fused=False \(--no-fused\)"):
            load_model(folder, weights=fmt)
        return
    # the kernels and the twins run one recipe (engine/ops/ref.py): a layer's outputs differ in the last bits (the
    # fold's order), which can move a later layer's 8-bit activation across a rounding boundary, one step of it
    fused = Engine(load_model(folder, weights=fmt), 64).logits(ids)
    assert (fused - got).abs().max().item() <= 0.05 * got.std().item()
    assert (fused.argmax(-1) == got.argmax(-1)).float().mean() >= 0.9


def test_kept_k_quant_blocks_run_on_their_twins(tmp_path):
    """weights="q4_k" on the torch path runs a file's Q4_K tensors as they are: their values, bit for bit."""
    from safetensors.torch import load_file

    from gguf_files import family_files

    gguf_file, values = family_files("llama", tmp_path)
    model = load_model(gguf_file, weights="q4_k", fused=False, cache_dir=tmp_path / "cache", progress=lambda s: None)
    wo = model.layers[1].attn.wo.weight
    assert wo.fmt == "q4_k" and "attn_output" not in " ".join(model.load_notes)
    want = load_file(values / "model.safetensors")["model.layers.1.self_attn.o_proj.weight"]
    assert torch.equal(weights.dequantize(weights.unpack(wo)), want)


@pytest.mark.slow
def test_the_gemma3_files_own_tensors_decode_as_gguf_does():
    """Every block type of the embedded Gemma 3 270M (Q8_0 embeddings, Q5_0, Q4_K, Q6_K), a few rows of each, and
    the same bytes packed for the CPU kernels by pack_gguf (Q5_0, Q4_K, Q6_K)."""
    from gguf import GGUFReader

    from engine.checkpoint import embedded

    reader = GGUFReader(embedded.gguf_path(embedded.GEMMA3_270M))
    seen = set()
    for t in reader.tensors:
        fmt = weights.BY_GGUF.get(t.tensor_type.name)
        if fmt is None or t.tensor_type.name in seen:
            continue
        seen.add(t.tensor_type.name)
        out, n_in = 64, int(t.shape[0])
        raw = torch.from_numpy(np.array(t.data[:out], np.uint8))
        b = weights.get(fmt).from_gguf(raw, out, n_in)
        want = gguf_dequantize(raw, t.tensor_type.name, out, n_in)
        assert np.array_equal(weights.dequantize(b).numpy(), want)
        cpu = weights.get(fmt).layouts.get("cpu")
        if cpu is not None and cpu.pack_gguf is not None:  # the file's bytes straight into the kernels' panels
            packed = weights.Packed(fmt, "cpu", out, n_in, cpu.pack_gguf(raw, out, n_in))
            assert np.array_equal(weights.rows(packed, torch.arange(out)).numpy(), want), t.tensor_type.name
    assert seen == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}


def test_a_q5_k_mix_of_rows_that_are_not_whole_super_blocks_runs_its_q5_1_blocks(tmp_path):
    """llama.cpp's Q5_K mixes store a tensor whose rows are not whole super-blocks (SmolLM2's 576 and 960 inputs) as
    Q5_1: such a file loads in place, its Q5_1 tensors on their own kernel with their values bit for bit, and the
    kernels give the twins' logits and greedy ids."""
    from safetensors.torch import load_file

    from gguf_files import write_gguf

    shape = dict(hidden_size=192, intermediate_size=320, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                 num_hidden_layers=2)
    mix = {"attn_q": "Q5_1", "attn_k": "Q5_1", "attn_v": "Q8_0", "attn_output": "Q5_1", "ffn_gate": "Q5_1",
           "ffn_up": "Q5_1", "ffn_down": "Q8_0", "token_embd": "Q8_0"}
    folder = write_tiny_model(tmp_path / "hf", tiny_config("qwen2", tie_word_embeddings=True, **shape), seed=7)
    path = tmp_path / "m.gguf"
    values = write_gguf(folder, path, mix)
    model = load_model(path, cache_dir=tmp_path / "cache", progress=lambda s: None)
    notes = " ".join(model.load_notes)
    assert "Q5_1 as q5_1 (10)" in notes and "second rounding" not in notes
    ref = load_file(values / "model.safetensors")
    mlp = model.layers[1].mlp.w_gate_up.weight
    assert mlp.fmt == "q5_1" and model.layers[0].attn.wo.weight.fmt == "q5_1"
    want = torch.cat([ref[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    assert torch.equal(weights.dequantize(weights.unpack(mlp)), want)
    ids = list(range(3, 40))
    twin = Engine(load_model(path, fused=False, cache_dir=tmp_path / "cache", progress=lambda s: None), 96)
    got, want = Engine(model, 96).logits(ids), twin.logits(ids)
    assert (got - want).abs().max().item() <= 0.05 * want.std().item()
    assert Engine(model, 96).generate(ids, 16, stop_ids=[])[0] == twin.generate(ids, 16, stop_ids=[])[0]
