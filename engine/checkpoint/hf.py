"""An HF-format model folder: config.json + *.safetensors + tokenizer.json, and the tensors a model needs from it.

Every tensor's presence and shape is checked from the safetensors headers before a byte is loaded, so a bad
folder fails at once with the tensor's name and both shapes. The tensors' names come from the family's recipe
(engine/families/). A folder converted from a GGUF file also keeps the file's own quantized blocks (BLOCKS_FILE)
and every tensor's GGUF type (TYPES_FILE), which the loader uses where a weight format holds those blocks.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from engine import weights as wts
from engine.config import ConfigError, ModelConfig

BLOCKS_FILE = "blocks.safetensors"
TYPES_FILE = "gguf.json"  # {"source": file name, "tensors": {hf name: [gguf name, GGUF type]}}


class ModelLoadError(ValueError):
    """A model folder we cannot load; the message says what is wrong and what to do."""


def symbols(cfg: ModelConfig) -> dict[str, int]:
    """The shape symbols of the families' tensor tables (engine/families/recipe.py) for this config."""
    C, I, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    return {"C": C, "I": I, "2I": 2 * I, "V": cfg.vocab_size, "D": cfg.head_dim, "q": q, "kv": kv, "qkv": q + 2 * kv}


def _tensors(cfg: ModelConfig):
    """(our parameter, HF tensor, its shape) for every tensor the model needs, in load order, from the family's
    table: our module <- the HF modules whose weights are concatenated (dim 0) into it."""
    family, size = cfg.family, symbols(cfg)
    for ours, parts in family.top.items():
        if cfg.tie_word_embeddings and ours == "lm_head":
            continue
        if cfg.tie_word_embeddings and ours == "embed":  # the head holds the tied embedding (Transformer)
            ours = "lm_head"
        for hf, _, shape in parts:
            yield f"{ours}.weight", f"{hf}.weight", tuple(size[d] for d in shape)
    for i in range(cfg.n_layers):
        for ours, parts in family.layer.items():
            for hf, _, shape in parts:
                yield f"layers.{i}.{ours}.weight", f"model.layers.{i}.{hf}.weight", tuple(size[d] for d in shape)
            for hf, _, shape in parts if cfg.attention_bias and ours == "attn.wqkv" else ():
                yield f"layers.{i}.{ours}.bias", f"model.layers.{i}.{hf}.bias", (size[shape[0]],)


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


class KeptBlocks:
    """A converted GGUF folder's own blocks (BLOCKS_FILE: each format's canonical Blocks fields as
    '<hf name>.<format>.<field>') and every tensor's GGUF type (TYPES_FILE); empty for any other folder."""

    FIELDS = ("q", "d", "m", "sc", "mn")

    def __init__(self, folder: Path, device):
        types = folder / TYPES_FILE
        self.types: dict[str, tuple[str, str]] = (
            {k: tuple(v) for k, v in json.loads(types.read_text())["tensors"].items()} if types.is_file() else {})
        self.file = folder / BLOCKS_FILE if (folder / BLOCKS_FILE).is_file() else None
        self.device = device

    def gguf_type(self, name: str) -> str | None:
        return self.types.get(name, (None, None))[1]

    def gguf_name(self, name: str) -> str:
        return self.types.get(name, (name,))[0]

    def block_typed(self, name: str) -> bool:
        """Whether the file stored HF tensor `name` in blocks (any quantized GGUF type, with a record or not)."""
        return self.gguf_type(name) not in (None, "F32", "F16", "BF16", "F64")

    def stored_format(self, name: str) -> str | None:
        """The weight format holding the file's blocks of HF tensor `name` as they are (None: not block-typed)."""
        return wts.BY_GGUF.get(self.gguf_type(name))

    def blocks(self, names: list[str], fmt: str, n_in: int) -> wts.Blocks | None:
        """The HF tensors' own blocks as Blocks of `fmt` for a weight [out, n_in], concatenated like their weights
        (dim 0), when every one of them is stored in a format `fmt` holds exactly (engine/weights: reblock);
        None otherwise."""
        stored = [self.stored_format(n) for n in names]
        if self.file is None or fmt not in wts.QUANTIZED or None in stored:
            return None
        if any(s != fmt and fmt not in wts.get(s).exact_in for s in stored):
            return None
        parts = []
        with safe_open(self.file, framework="pt", device=str(self.device)) as f:
            for n, s in zip(names, stored, strict=True):
                t = {k: f.get_tensor(f"{n}.{s}.{k}") for k in self.FIELDS if f"{n}.{s}.{k}" in f.keys()}
                b = wts.Blocks(s, t["q"].shape[0], n_in, **t)
                parts.append(wts.reblock(b, fmt))
        fields = {k: torch.cat([getattr(p, k) for p in parts]) for k in self.FIELDS if getattr(parts[0], k) is not None}
        return wts.Blocks(fmt, fields["q"].shape[0], n_in, **fields)
