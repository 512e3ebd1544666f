"""load_model: a model folder, a GGUF file, a hub id or the embedded default, onto a device in a weight format.

The folder is read through hf.py (checked before a byte is loaded); q/k/v and gate/up are concatenated into the
model's merged projections while loading, each packed into the layout of the path that runs it.
"""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from engine import ops
from engine import weights as wts
from engine.checkpoint.hf import BLOCKS_FILE, ModelLoadError, check_folder, native_blocks, our_targets
from engine.config import ModelConfig
from engine.model import Linear, Transformer
from engine.tokenizer import Tokenizer

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_path(name: str | None, cache_dir: str | Path | None = None, progress=print) -> Path:
    """A local folder, a llama GGUF file (converted once into the cache), a hub id (downloaded when the hub is
    reachable), or None for the embedded default."""
    if name is None:
        from engine.checkpoint import default_model

        return default_model.ensure(cache_dir, progress=progress)
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {name!r} does not exist")
        from engine.checkpoint import gguf_convert

        try:  # converted into the model cache once; a changed file is converted again
            return gguf_convert.cached(path, cache_dir, progress)
        except ValueError as e:
            raise ModelLoadError(f"cannot convert {name}: {e}") from None
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelLoadError(f"model folder {name!r} does not exist; pass a folder with config.json, "
                             "*.safetensors and tokenizer.json, a hub id such as 'org/model', "
                             "or nothing for the default")
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors", "*.jinja", "tokenizer*"]
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as e:  # the hub client raises many types: offline, 404, gated, auth
        raise ModelLoadError(f"could not fetch hub id {name!r} ({type(e).__name__}: {e}); "
                             "check the id and network access, or download it and pass the folder") from None


def pick_dtype(dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None:
        # bf16 halves the bytes per step on a GPU; CPU matmuls are fastest (and exact) in fp32
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def pick_format(weights: str | None, dtype: torch.dtype, opset: ops.OpSet, native: bool) -> str:
    """The projections' format: as asked, else q4 for a model with native q4 blocks where the q4 kernel runs
    (lossless there, and the fastest), else the activations' dtype."""
    dense = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    if weights is None:
        return "q4" if native and opset.name == "fused" else dense
    fmt = check_format_name(weights)
    if opset.layout == "cpu" and fmt not in wts.PANEL_FORMATS:
        cpu = [f for f in wts.PANEL_FORMATS if f in wts.FORMATS]
        raise ModelLoadError(f"weights={fmt!r} has no CPU kernel; pick one of {', '.join(cpu)}")
    return fmt


def check_format_name(weights: str) -> str:
    try:
        return wts.check_format(weights)
    except ValueError as e:
        raise ModelLoadError(str(e)) from None


def head_format(fmt: str) -> str:
    """The LM head's format: a q4 model keeps its head in 8-bit blocks, as the GGUF files of small models do
    (the default model's is Q8_0): the head sees every token's logits, where 4 bits cost the most quality. It
    runs as q8 (engine/weights/q8_0.py): those blocks against 16-bit activations on a CPU, as q4's own."""
    return wts.get(fmt).head or fmt


def load_model(name: str | Path | None = None, device="cpu", dtype=None, weights: str | None = None,
               fused: bool = True, cache_dir=None, progress=print) -> Transformer:
    """Load a model folder / hub id / the embedded default (None) straight onto `device`.

    dtype: the activations' (default fp32 on CPU, bf16 on CUDA). weights: the projections' format, one of
    engine/weights.py FORMATS (default: q4 where the model ships q4 blocks and its kernel runs, else dtype)."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but torch sees no CUDA device; use device='cpu'")
    if weights is not None:
        check_format_name(weights)  # a typo fails before any download or build
    folder = resolve_path(None if name is None else str(name), cache_dir, progress)
    cfg, found = check_folder(folder)
    dt = pick_dtype(dtype, device)
    opset = ops.select(device, fused, cfg.head_dim, dt)
    fmt = pick_format(weights, dt, opset, native=(folder / BLOCKS_FILE).is_file())
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device=device).to(dt)
    params = dict(model.named_parameters())
    handles = {f: safe_open(f, framework="pt", device=str(device)) for f, _ in set(found.values())}
    with torch.no_grad():
        for ours, names in our_targets(cfg).items():
            owner, kind = ours.rsplit(".", 1)
            module = model.get_submodule(owner)
            if not (isinstance(module, Linear) and kind == "weight"):
                params[ours].copy_(torch.cat([handles[found[n][0]].get_tensor(n) for n in names]))
                continue
            f = head_format(fmt) if module is model.lm_head else fmt
            blocks = native_blocks(folder, names, f, device)
            if blocks is None:  # HF layout: [out, in]
                blocks = wts.quantize(torch.cat([handles[found[n][0]].get_tensor(n).to(dt) for n in names]), f)
            module.weight = wts.pack(blocks, opset.layout)
    model.requires_grad_(False).eval()
    model.path, model.eos_ids = folder, tuple(sorted(Tokenizer(folder).eos_ids))
    model.use_ops(opset)
    return model


def random_model(cfg: ModelConfig, device="cpu", dtype=None, weights: str | None = None, fused: bool = True,
                 std: float = 0.02, seed: int = 0) -> Transformer:
    """Random weights of a real model's shape, in a format: decode speed depends on the shape, the format
    and the kernels, not on the values, so benchmarks time these where a checkpoint is out of reach."""
    device = torch.device(device)
    dt = pick_dtype(dtype, device)
    opset = ops.select(device, fused, cfg.head_dim, dt)
    fmt = pick_format(weights, dt, opset, native=False)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.device(device):
        model = Transformer(cfg).to(dt)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std, generator=g) if p.dim() > 1 else p.fill_(1.0)
        for m in model.linears():
            w = torch.randn(m.out_features, m.in_features, generator=g, device=device, dtype=dt) * std
            m.weight = wts.pack(wts.quantize(w, head_format(fmt) if m is model.lm_head else fmt), opset.layout)
    model.requires_grad_(False).eval()
    model.use_ops(opset)
    return model
