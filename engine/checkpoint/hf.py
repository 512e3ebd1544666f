"""An HF-format model folder: config.json + *.safetensors + tokenizer.json, and the tensors a model needs from it.

Every tensor's presence and shape is checked from the safetensors headers before a byte is loaded, so a bad
folder fails at once with the tensor's name and both shapes. A folder converted from a GGUF file also keeps
the file's own quantized blocks (BLOCKS_FILE), which the loader uses where a weight format asks for them.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from engine import weights as wts
from engine.config import ConfigError, ModelConfig

BLOCKS_FILE = "blocks.safetensors"


class ModelLoadError(ValueError):
    """A model folder we cannot load; the message says what is wrong and what to do."""


# Every tensor of a llama-family checkpoint, in one table: our module <- the HF modules whose weights are
# concatenated (dim 0) into it, each with its GGUF name (the default model's converter reads GGUF through it).
LAYER_MODULES = {
    "attn_norm": [("input_layernorm", "attn_norm")],
    "mlp_norm": [("post_attention_layernorm", "ffn_norm")],
    "attn.wqkv": [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v")],
    "attn.wo": [("self_attn.o_proj", "attn_output")],
    "mlp.w_gate_up": [("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up")],
    "mlp.w_down": [("mlp.down_proj", "ffn_down")],
}
TOP_MODULES = {"embed": [("model.embed_tokens", "token_embd")], "norm": [("model.norm", "output_norm")],
               "lm_head": [("lm_head", "output")]}
BIASED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # Qwen2's attention_bias


def hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF module name (per layer without its model.layers.N. prefix) -> weight shape, [out, in] for matrices."""
    C, I, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    return {"input_layernorm": (C,), "post_attention_layernorm": (C,), "self_attn.q_proj": (q, C),
            "self_attn.k_proj": (kv, C), "self_attn.v_proj": (kv, C), "self_attn.o_proj": (C, q),
            "mlp.gate_proj": (I, C), "mlp.up_proj": (I, C), "mlp.down_proj": (C, I),
            "model.embed_tokens": (cfg.vocab_size, C), "model.norm": (C,), "lm_head": (cfg.vocab_size, C)}


def _tensors(cfg: ModelConfig):
    """(our parameter, HF tensor, its shape) for every tensor the model needs, in load order."""
    shapes = hf_shapes(cfg)
    for ours, parts in TOP_MODULES.items():
        if cfg.tie_word_embeddings and ours == "lm_head":
            continue
        if cfg.tie_word_embeddings and ours == "embed":  # the head holds the tied embedding (Transformer)
            ours = "lm_head"
        for hf, _ in parts:
            yield f"{ours}.weight", f"{hf}.weight", shapes[hf]
    for i in range(cfg.n_layers):
        for ours, parts in LAYER_MODULES.items():
            for hf, _ in parts:
                yield f"layers.{i}.{ours}.weight", f"model.layers.{i}.{hf}.weight", shapes[hf]
            for hf, _ in parts if cfg.attention_bias and parts[0][0] in BIASED else ():
                yield f"layers.{i}.{ours}.bias", f"model.layers.{i}.{hf}.bias", shapes[hf][:1]


def our_targets(cfg: ModelConfig) -> dict[str, list[str]]:
    """Our parameter name -> the HF tensors concatenated (dim 0) into it."""
    out: dict[str, list[str]] = {}
    for ours, hf, _ in _tensors(cfg):
        out.setdefault(ours, []).append(hf)
    return out


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for every tensor the model needs."""
    return {hf: shape for _, hf, shape in _tensors(cfg)}


def index_tensors(folder: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """HF tensor name -> (file, shape), read from the safetensors headers only (sharded or not)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"no *.safetensors files in {folder}; decodescope loads safetensors weights only")
    found = {}
    for f in files:
        with safe_open(f, framework="pt") as sf:
            for name in sf.keys():
                found[name] = (f, tuple(sf.get_slice(name).get_shape()))
    return found


def check_folder(folder: Path) -> tuple[ModelConfig, dict]:
    for required in ("config.json", "tokenizer.json"):
        if not (folder / required).is_file():
            raise ModelLoadError(f"{folder} has no {required}; an HF-format model folder needs config.json, "
                                 "*.safetensors and tokenizer.json")
    try:
        cfg = ModelConfig.from_json(folder / "config.json")
    except ConfigError as e:
        raise ModelLoadError(f"{folder}: {e}") from None
    found = index_tensors(folder)
    for name, shape in expected_shapes(cfg).items():
        if name not in found:
            raise ModelLoadError(f"{folder} is missing the tensor {name!r} (expected shape {list(shape)})")
        if found[name][1] != shape:
            raise ModelLoadError(f"tensor {name!r} in {found[name][0].name} has shape {list(found[name][1])}, "
                                 f"the config expects {list(shape)}")
    return cfg, found


def native_blocks(folder: Path, names: list[str], fmt: str, device) -> wts.Blocks | None:
    """The HF tensors' own blocks in `fmt`, concatenated like their weights, when the folder kept them
    (a converted GGUF file: engine/checkpoint/gguf_convert.py); None otherwise."""
    file = folder / BLOCKS_FILE
    if fmt not in wts.QUANTIZED or not file.is_file():
        return None
    stored = "int8" if fmt == "q8" else fmt  # Q8_0 blocks, whichever way they run
    with safe_open(file, framework="pt", device=str(device)) as f:
        keys = set(f.keys())
        if not all(f"{n}.{stored}.q" in keys for n in names):
            return None
        kinds = [k for k in ("q", "d", "m") if f"{names[0]}.{stored}.{k}" in keys]
        parts = [[f.get_tensor(f"{n}.{stored}.{k}") for n in names] for k in kinds]
    out, n_in = sum(p.shape[0] for p in parts[0]), parts[0][0].shape[1]
    return wts.Blocks(fmt, out, n_in, *(torch.cat(p) for p in parts))
