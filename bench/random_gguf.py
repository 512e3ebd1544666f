"""Random-weight llama models of real shapes as GGUF files, one per weight type, in llama.cpp's tensor naming and
q/k row order: the files bench/scaling.py times ours and llama.cpp's on (our engine reads them through
engine/checkpoint/gguf_convert.py, like any GGUF file).

    folder = ensure("360M")                      # <cache>/random-gguf/360M-v1/, written on the first call
    folder / "random-360M-Q4_1.gguf"

One pass writes all four files from the same random weights (a seeded generator per tensor, HF layout, q/k rows
permuted as llama.cpp's converter does): F32; F16; Q8_0; and Q4_1 for the layers' projections with the embedding
(and an untied head) in Q8_0, the layout of the default model's own file. Norms stay F32, as llama.cpp keeps
them. The tokenizer is the default model's (SmolLM2's byte-level BPE, the one our converter rebuilds), so every
shape has its 49152-token vocabulary; Qwen2.5's shapes (BIG_SHAPES, kquant_file) pad it to their 151936 rows.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from engine.checkpoint import default_model, store
from engine.checkpoint.store import Progress

WRITER_VERSION = 1  # bump when the files change: the folder's name carries it
VOCAB = 49152  # the default model's tokenizer, which every full-size file carries
KINDS = ("F32", "F16", "Q8_0", "Q4_1")
STD = 0.02  # the usual init scale: logits over the vocabulary spread ~0.5, so greedy picks are rarely near-ties
SHAPES = {
    # SmolLM2-135M, the embedded default model (30 layers, GQA 9/3, tied head)
    "135M": dict(like="SmolLM2-135M", hidden=576, intermediate=1536, layers=30, heads=9, kv_heads=3, tied=True,
                 rope_theta=100000.0),
    # SmolLM2-360M (32 layers, GQA 15/5, tied head)
    "360M": dict(like="SmolLM2-360M", hidden=960, intermediate=2560, layers=32, heads=15, kv_heads=5, tied=True,
                 rope_theta=100000.0),
    # TinyLlama-1.1B's layers (22, GQA 32/4, its own head), with SmolLM2's vocabulary
    "1.1B": dict(like="TinyLlama-1.1B's layers", hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4,
                 tied=False, rope_theta=10000.0),
}
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_1": 3, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_* of each file
# Qwen2.5's shapes (llama blocks without the q/k/v biases), with its 151936 embedding rows: SmolLM2's tokens
# followed by unused [PAD] ones, as llama.cpp's converter fills the rows Qwen2.5's own tokenizer leaves unnamed
# (padded), so a file is the size people download (1.5B Q4_K_M: 0.98 GB). Too big for four files each, so only a
# Q4_K_M file is made (kquant_file), from an F16 one that is then removed.
QWEN25_VOCAB = 151936
BIG_SHAPES = {
    "1.5B": dict(like="Qwen2.5-1.5B", hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, tied=True,
                 rope_theta=1000000.0, vocab=QWEN25_VOCAB),
    "3B": dict(like="Qwen2.5-3B", hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2, tied=True,
               rope_theta=1000000.0, vocab=QWEN25_VOCAB),
    "7B": dict(like="Qwen2.5-7B", hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, tied=False,
               rope_theta=1000000.0, vocab=QWEN25_VOCAB),
}
UNUSED = 5  # llama.cpp's token type of a padding row's token


def path(folder: Path, shape: str, kind: str) -> Path:
    return folder / f"random-{shape}-{kind}.gguf"


def ensure(shape: str, cache_dir=None, progress: Progress = print) -> Path:
    """The folder with the four files of `shape`, written once into the cache (under its lock)."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r} is not one of {', '.join(SHAPES)}")
    folder = store.cache_dir(cache_dir) / "random-gguf" / f"{shape}-v{WRITER_VERSION}"
    if store.marker(folder) is not None:
        return folder
    with store.locked(folder, progress):
        if store.marker(folder) is None:
            tok = tokenizer_fields(default_model.gguf_path(cache_dir, progress))
            if len(tok["tokens"]) != VOCAB:
                raise ValueError(f"the default model's GGUF has {len(tok['tokens'])} tokens, not {VOCAB}")
            store.build(folder, lambda tmp: write(tmp, shape, SHAPES[shape], tok, progress=progress),
                        {"shape": SHAPES[shape], "version": WRITER_VERSION})
    return folder


def kquant_name(shape: str) -> str:
    """The name a shape's files carry: a vocabulary other than the default model's is part of it."""
    vocab = {**SHAPES, **BIG_SHAPES}[shape].get("vocab", VOCAB)
    return shape if vocab == VOCAB else f"{shape}-{vocab}tok"


KQUANT_KINDS = ("Q4_K_M", "Q3_K_M", "Q2_K", "Q5_K_M", "Q6_K")  # llama-quantize's mixes of the types we read natively


def kquant_file(shape: str, folder: Path, kind: str = "Q4_K_M", cache_dir=None, progress: Progress = print) -> Path:
    """random-{shape}[-{vocab}tok]-{kind}.gguf in `folder`, made as people's files are: a random F16 file written a
    tensor at a time (never the model in memory), quantized by llama.cpp's own llama-quantize (its K-quant
    choices, its Q4_K_M mix), the F16 file removed afterwards (15 GB for 7B)."""
    import subprocess

    from bench import llamacpp

    s, name = {**SHAPES, **BIG_SHAPES}[shape], kquant_name(shape)
    out = path(folder, name, kind)
    if out.exists():
        return out
    exe = llamacpp.quantize_binary()
    if exe is None:
        raise FileNotFoundError(f"{llamacpp.prefix() / 'bin' / 'llama-quantize'} is missing: scripts/build_llamacpp.sh "
                                "builds it")
    tok = padded(tokenizer_fields(default_model.gguf_path(cache_dir, progress)), s.get("vocab", VOCAB))
    f16 = path(folder, name, "F16")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        write(folder, name, s, tok, kinds=("F16",), progress=progress)
        progress(f"decodescope: llama-quantize {f16.name} -> {out.name}")
        cmd = [str(exe), str(f16), str(out.with_suffix(".partial")), kind, "2"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=llamacpp.clean_env(), check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        out.with_suffix(".partial").rename(out)
    finally:
        f16.unlink(missing_ok=True)
        out.with_suffix(".partial").unlink(missing_ok=True)
    return out


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF's q/k rows -> llama.cpp's (convert_hf_to_gguf.py's permute): each head's two rotary halves
    interleaved into pairs. gguf_convert.unpermute is its inverse."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(s: dict, vocab: int) -> list[tuple[str, tuple[int, ...], str | None, int | None]]:
    """(GGUF name, HF-layout shape [out, in], its role, its q/k head count) for every tensor, in file order.
    Roles: 'norm' (1-D, F32 in every file), 'embed' (the embedding and the head), 'linear'."""
    C, I, D = s["hidden"], s["intermediate"], s["hidden"] // s["heads"]
    out = [("token_embd.weight", (vocab, C), "embed", None), ("output_norm.weight", (C,), "norm", None)]
    if not s["tied"]:
        out.append(("output.weight", (vocab, C), "embed", None))
    for i in range(s["layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (C,), "norm", None),
                (b + "attn_q.weight", (s["heads"] * D, C), "linear", s["heads"]),
                (b + "attn_k.weight", (s["kv_heads"] * D, C), "linear", s["kv_heads"]),
                (b + "attn_v.weight", (s["kv_heads"] * D, C), "linear", None),
                (b + "attn_output.weight", (C, s["heads"] * D), "linear", None),
                (b + "ffn_norm.weight", (C,), "norm", None),
                (b + "ffn_gate.weight", (I, C), "linear", None),
                (b + "ffn_up.weight", (I, C), "linear", None),
                (b + "ffn_down.weight", (C, I), "linear", None)]
    return out


def random_tensor(index: int, shape: tuple[int, ...], role: str, seed: int = 0) -> np.ndarray:
    """Tensor number `index` of the model, HF layout, fp32: the same values in every file and every run."""
    if role == "norm":
        return np.ones(shape, np.float32)
    rng = np.random.default_rng([seed, index])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(STD)


def file_tensor(index: int, shape: tuple[int, ...], role: str, heads: int | None, seed: int = 0) -> np.ndarray:
    """random_tensor in llama.cpp's layout, as every file holds it: a q/k projection's rows permuted (heads)."""
    t = random_tensor(index, shape, role, seed)
    return t if heads is None else permute(t, heads)


def stored_type(kind: str, role: str) -> str:
    """The GGUF type a tensor of `role` is stored in, in the file of `kind`."""
    if role == "norm":
        return "F32"
    if kind == "Q4_1" and role == "embed":
        return "Q8_0"
    return kind


def encode(w: np.ndarray, qtype: str) -> np.ndarray:
    """fp32 [out, in] -> the array the writer stores: the values (F32, F16) or the raw blocks (uint8)."""
    from gguf import GGMLQuantizationType, quants

    if qtype == "F32":
        return w
    if qtype == "F16":
        return w.astype(np.float16)
    return quants.quantize(w, GGMLQuantizationType[qtype])


def tensor_info(dims: tuple[int, ...], qtype: str) -> tuple[tuple[int, ...], np.dtype, int, object]:
    """What the writer declares before any data: the stored array's shape, dtype, byte count and GGUF type."""
    from gguf import GGMLQuantizationType, quant_shape_to_byte_shape

    if qtype in ("F32", "F16"):
        dtype = np.dtype(np.float32 if qtype == "F32" else np.float16)
        return dims, dtype, int(np.prod(dims)) * dtype.itemsize, None
    raw = GGMLQuantizationType[qtype]
    stored = quant_shape_to_byte_shape(dims, raw)
    return stored, np.dtype(np.uint8), int(np.prod(stored)), raw


@functools.cache
def tokenizer_fields(gguf_file: Path, vocab: int | None = None) -> dict:
    """The default model's tokenizer metadata, to copy into every file. `vocab` keeps its first tokens only
    (and the merges among them), for the tests' tiny models: reading and writing 49152 tokens and 48900 merges
    is most of the time a small file takes."""
    from engine.checkpoint import gguf_header

    f = gguf_header.read(Path(gguf_file)).fields
    tokens = f["tokenizer.ggml.tokens"][:vocab]
    known = set(tokens)
    merges = [m for m in f["tokenizer.ggml.merges"]
              if vocab is None or (set(m.split(" ")) <= known and m.replace(" ", "") in known)]
    out = dict(tokens=tokens, token_type=f["tokenizer.ggml.token_type"][:vocab], merges=merges)
    for key in ("model", "pre", "bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in f:
            out[key] = f[f"tokenizer.ggml.{key}"]
    if "tokenizer.chat_template" in f:
        out["chat_template"] = f["tokenizer.chat_template"]
    return out


def padded(tok: dict, vocab: int) -> dict:
    """tok (tokenizer_fields) with unused tokens [PAD{i}] up to `vocab` rows, as llama.cpp's converter pads a
    vocabulary shorter than its model's embedding (Qwen2.5's 151936 rows)."""
    n = len(tok["tokens"])
    if vocab < n:
        raise ValueError(f"vocab {vocab} is below the tokenizer's {n} tokens")
    return {**tok, "tokens": list(tok["tokens"]) + [f"[PAD{i}]" for i in range(n, vocab)],
            "token_type": list(tok["token_type"]) + [UNUSED] * (vocab - n)}


def write(folder: Path, shape: str, s: dict, tok: dict, kinds=KINDS, seed: int = 0, progress: Progress = print) -> None:
    """Write random-{shape}-{kind}.gguf for each kind into `folder` (tok: tokenizer_fields), one tensor at a time."""
    from gguf import GGUFWriter

    tensors = hf_tensors(s, len(tok["tokens"]))
    writers = {k: GGUFWriter(path(folder, shape, k), "llama") for k in kinds}
    for kind, w in writers.items():
        metadata(w, shape, s, kind, tok)
        for name, dims, role, _ in tensors:
            w.add_tensor_info(name, *tensor_info(dims, stored_type(kind, role)))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
    for i, (_name, dims, role, heads) in enumerate(tensors):
        t = file_tensor(i, dims, role, heads, seed)
        for kind, w in writers.items():
            w.write_tensor_data(encode(t, stored_type(kind, role)))
        if i % 64 == 0:
            progress(f"decodescope: random {shape} GGUFs: tensor {i + 1}/{len(tensors)}")
    for w in writers.values():
        w.close()


def metadata(w, shape: str, s: dict, kind: str, tok: dict) -> None:
    """The llama.* hyperparameters, and the default model's tokenizer."""
    w.add_name(f"random {shape} llama ({kind})")
    w.add_block_count(s["layers"])
    w.add_context_length(8192)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["intermediate"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_dimension_count(s["hidden"] // s["heads"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(FILE_TYPES[kind])
    w.add_quantization_version(2)
    w.add_vocab_size(len(tok["tokens"]))
    w.add_tokenizer_model(tok["model"])
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["token_type"])
    w.add_token_merges(tok["merges"])
    for key, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                     ("unknown_token_id", w.add_unk_token_id), ("padding_token_id", w.add_pad_token_id)):
        if key in tok:
            add(tok[key])
    w.add_add_bos_token(False)
    if "chat_template" in tok:
        w.add_chat_template(tok["chat_template"])


def describe(folder: Path) -> dict:
    """The marker's record of a folder: the shape and the writer's version."""
    return json.loads((folder / store.MARKER).read_text())
