"""An HF-format model folder: config.json + *.safetensors + tokenizer.json, and the tensors a model needs from it.

Every tensor's presence and shape is checked from the safetensors headers before a byte is loaded, so a bad
folder fails at once with the tensor's name and both shapes. The tensors' names come from the family's recipe
(engine/families/). A GGUF file's folder (gguf_convert.py) has no safetensors: its index names the file whose
tensors the loader reads in place (sources.py).
"""
from __future__ import annotations

from pathlib import Path


from engine.checkpoint import sources
from engine.checkpoint.errors import ModelLoadError
from engine.config import ConfigError, ModelConfig


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
    from safetensors import safe_open  # here: a GGUF load never imports it

    found = {}
    for f in files:
        with safe_open(f, framework="pt") as sf:
            for name in sf.keys():
                found[name] = (f, tuple(sf.get_slice(name).get_shape()))
    return found


def check_folder(folder: Path):
    """(the folder's config, the source of its tensors), every tensor the config needs present in its shape."""
    for required in ("config.json", "tokenizer.json"):
        if not (folder / required).is_file():
            raise ModelLoadError(f"{folder} has no {required}; an HF-format model folder needs config.json, "
                                 "*.safetensors and tokenizer.json")
    try:
        cfg = ModelConfig.from_json(folder / "config.json")
    except ConfigError as e:
        raise ModelLoadError(f"{folder}: {e}") from None
    src = sources.source(folder, cfg, None if (folder / sources.INDEX_FILE).is_file() else index_tensors(folder))
    for name, shape in expected_shapes(cfg).items():
        if name not in src.shapes:
            raise ModelLoadError(f"{folder} is missing the tensor {name!r} (expected shape {list(shape)})")
        if src.shapes[name] != shape:
            raise ModelLoadError(f"tensor {name!r} in {src.path.name} has shape {list(src.shapes[name])}, "
                                 f"the config expects {list(shape)}")
    return cfg, src
