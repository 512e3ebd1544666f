"""Small GGUF files of every family, written here as llama.cpp's converter writes them (its tensor names, its q/k
row permutation for llama-arch files, Gemma's norms stored as 1 + w, Llama 3's rope scaling as a rope_freqs
tensor) from a random HF folder (engine/tiny.py), with their matrices in a mix of block types (the blocks made by
engine/weights' quantizers and written with its GGUF codecs), beside the HF folder those blocks dequantize to:
the reference the converted file must match. Used by tests/test_gguf_*.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from engine import weights
from engine.checkpoint.sources import DENSE_TYPES
from engine.config import ModelConfig, Rope
from engine.tiny import byte_tokenizer_json, tiny_config, write_tiny_model

# like Q4_K_M files: 5- and 8-bit attention inputs, 4-bit K-quants for the output and gates, 6-bit for down
MIX = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_qkv": "Q5_K", "attn_output": "Q4_K",
       "ffn_gate": "Q4_1", "ffn_up": "Q4_0", "ffn_down": "Q6_K", "token_embd": "Q8_0", "output": "Q5_K"}
# shapes every block type fits (K-quants need inputs in multiples of 256)
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             num_hidden_layers=2)
CONFIGS = {
    "llama": dict(rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                          high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=128),
    "phi3": dict(sliding_window=12),
    # head_dim 256 as Gemma 3's own (llama.cpp then scales attention by 1/sqrt(head_dim), as query_pre_attn_scalar)
    "gemma3_text": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                        num_hidden_layers=7, tie_word_embeddings=True),
    "gemma2": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                   attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True),
}


def family_config(model_type: str) -> ModelConfig:
    return tiny_config(model_type, **SHAPE | CONFIGS.get(model_type, {}))


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf LlamaModel.permute: each head's rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def quantized(w: torch.Tensor, kind: str, mix: dict[str, str]) -> tuple[str, torch.Tensor | None, torch.Tensor]:
    """(GGUF type, raw block bytes or None, the values the file stands for) of an HF weight [out, in]."""
    gtype = mix.get(kind, "F32")
    if gtype in ("F16", "BF16") and w.dim() == 2:  # a 16-bit dense tensor: its bytes, the values they stand for
        x = w.to(DENSE_TYPES[gtype]).contiguous()
        return gtype, x.view(torch.uint8), x.float()
    fmt = weights.BY_GGUF.get(gtype)
    if fmt is None or w.dim() != 2 or w.shape[1] % weights.get(fmt).block:
        return "F32", None, w
    b = weights.get(fmt).quantize(w)
    return gtype, weights.get(fmt).to_gguf(b), weights.dequantize(b)


def write_gguf(folder: Path, path: Path, mix: dict[str, str] = MIX, tokenizer_pre: str = "default") -> Path:
    """The GGUF file of the HF folder; returns the HF folder of the values it stands for (<file stem>-values)."""
    import gguf

    cfg = ModelConfig.from_json(folder / "config.json")
    family = cfg.family
    arch = family.gguf_arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope.theta)
    if cfg.sliding_window:
        w.add_sliding_window(cfg.sliding_window)
    if cfg.attn_softcap:
        w.add_attn_logit_softcapping(cfg.attn_softcap)
        w.add_final_logit_softcapping(cfg.final_softcap)
    tok = json.loads(byte_tokenizer_json())
    tokens = sorted(tok["model"]["vocab"], key=tok["model"]["vocab"].get) + [t["content"] for t in tok["added_tokens"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tokenizer_pre)
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3] * (len(tokens) - 256))
    w.add_token_merges([])
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_ids[0])
    w.add_add_bos_token(False)
    w.add_chat_template(json.loads((folder / "tokenizer_config.json").read_text())["chat_template"])
    if cfg.rope.kind == "llama3":  # llama.cpp stores Llama 3's scaling as per-frequency divisors
        plain, scaled = Rope(cfg.rope.theta).inv_freq(cfg.head_dim, 0, 0), cfg.rope.inv_freq(cfg.head_dim, 0, 0)
        w.add_tensor("rope_freqs.weight", (plain / scaled).numpy().astype(np.float32))

    tensors, values = load_file(folder / "model.safetensors"), {}
    gguf_names = {hf: g for parts in (*family.top.values(), *family.layer.values()) for hf, g, _ in parts}
    heads = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads}
    for name, t in tensors.items():
        hf, leaf = name.rsplit(".", 1)
        layer = None
        if hf.startswith("model.layers."):
            _, _, layer, hf = hf.split(".", 3)
        kind = gguf_names[hf]
        gname = f"{kind}.{leaf}" if layer is None else f"blk.{layer}.{kind}.{leaf}"
        gtype, raw, values[name] = quantized(t, kind if leaf == "weight" else "", mix)
        if raw is None:
            stored = t.float().numpy()
            if name.endswith("norm.weight") and family.norm_offset:
                stored = stored + np.float32(family.norm_offset)
            if family.gguf_permute_qk and kind in heads:
                stored = permute(stored, heads[kind])
            w.add_tensor(gname, np.ascontiguousarray(stored))
        else:
            raw = raw.numpy()
            if family.gguf_permute_qk and kind in heads:
                raw = permute(raw, heads[kind])  # whole rows of blocks move
            w.add_tensor(gname, np.ascontiguousarray(raw), raw_dtype=getattr(gguf.GGMLQuantizationType, gtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = path.with_name(path.stem + "-values")
    shutil.copytree(folder, ref)
    save_file({k: v.contiguous() for k, v in values.items()}, ref / "model.safetensors")
    return ref


def family_files(model_type: str, root: Path, mix: dict[str, str] = MIX) -> tuple[Path, Path]:
    """(the GGUF file, the HF folder of its values) for a small random model of the family."""
    folder = write_tiny_model(root / model_type, family_config(model_type), seed=4)
    gguf_file = root / f"{model_type}.gguf"
    return gguf_file, write_gguf(folder, gguf_file, mix)
