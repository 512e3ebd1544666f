"""A llama-family GGUF file -> an HF-format folder the loader reads like any other, plus the file's own
quantized blocks.

Every tensor is dequantized to fp32 (model.safetensors), with the q/k row permutation llama.cpp's converter
applies undone. Tensors stored as Q4_1 or Q8_0 blocks are also kept as they are (blocks.safetensors), so
load_model(..., weights="q4" / "int8") runs the file's own blocks: lossless, no second rounding.

    convert(Path("model.gguf"), Path("out/"))
    folder = cached(Path("model.gguf"))   # <cache>/gguf/model-<key>/, converted on the first call only

The tokenizer is rebuilt from the file's vocabulary and merges for the byte-level BPE families whose
pre-tokenizer is written out here (SmolLM2's); any other fails before a tensor is read, naming it.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from engine.checkpoint import store
from engine.checkpoint.hf import BLOCKS_FILE, LAYER_MODULES, TOP_MODULES
from engine.checkpoint.store import Progress

CONTROL = 3  # llama.cpp's token_type for special tokens such as <|im_end|>
# Bump when the conversion changes: cached folders carry it (their names, or their markers), so a new
# converter rebuilds them and two versions of decodescope sharing a cache never rebuild each other's.
CONVERTER_VERSION = 2  # 2: the GGUF blocks are kept (blocks.safetensors)
Q4_1, Q8_0 = 3, 8  # GGMLQuantizationType values of the block formats we keep


def convert(gguf_file: Path, out: Path, progress: Progress = print) -> None:
    """Write an HF-format llama folder (fp32 safetensors, the kept blocks, config, tokenizer) from a GGUF file."""
    from gguf import GGUFReader  # only the first run needs it

    start = time.perf_counter()
    progress(f"decodescope: reading {gguf_file}")
    reader = GGUFReader(gguf_file)
    check_tokenizer(reader)
    config = hf_config(reader)
    tensors, blocks = hf_tensors(reader, config, progress)
    progress(f"decodescope: writing {out / 'model.safetensors'}")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    if blocks:
        save_file(blocks, str(out / BLOCKS_FILE), metadata={"format": "gguf-blocks"})
    progress("decodescope: writing the tokenizer and configs")
    build_tokenizer(reader).save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config(reader))
    _write_json(out / "config.json", config)
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    _write_json(out / "generation_config.json", {key: config[key] for key in ids})
    progress(f"decodescope: converted {len(tensors)} tensors in {time.perf_counter() - start:.1f} s")


MISSING = object()


def _meta(reader, key: str, default=MISSING):
    field = reader.fields.get(key)
    if field is None:
        if default is not MISSING:
            return default
        raise ValueError(f"{reader.data.filename} has no GGUF metadata key {key!r}")
    return field.contents()


def cached(gguf_file: Path, cache_dir: Path | None = None, progress: Progress = print) -> Path:
    """The converted folder for a GGUF file, converting it on the first call. The folder is keyed by the file's
    path, size and modification time and the converter's version, so a changed file is converted again (and
    the folder of its previous version removed)."""
    gguf_file = Path(gguf_file).expanduser().resolve()
    st = gguf_file.stat()
    source = f"{gguf_file}|{st.st_size}|{st.st_mtime_ns}|{CONVERTER_VERSION}"
    root = store.cache_dir(cache_dir) / "gguf"
    folder = root / f"{gguf_file.stem}-{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    if store.marker(folder) is not None:
        return folder
    with store.locked(folder, progress):
        if store.marker(folder) is not None:  # another process finished it while we waited
            return folder
        store.build(folder, lambda tmp: convert(gguf_file, tmp, progress), {"source": str(gguf_file), "key": source})
        for old in root.glob(f"{gguf_file.stem}-*/{store.MARKER}"):  # earlier versions of the same file
            if old.parent != folder and json.loads(old.read_text()).get("source") == str(gguf_file):
                shutil.rmtree(old.parent, ignore_errors=True)
    return folder


def hf_config(reader) -> dict:
    """config.json for LlamaForCausalLM from the llama.* metadata."""
    arch = _meta(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{reader.data.filename} holds a {arch!r} model; only 'llama' GGUF files convert")

    def hp(key):
        return _meta(reader, f"llama.{key}")

    def tok(key):
        return _meta(reader, f"tokenizer.ggml.{key}")

    hidden, n_heads = hp("embedding_length"), hp("attention.head_count")
    scaling = _meta(reader, "llama.rope.scaling.type", None)
    if scaling not in (None, "none", "linear"):
        raise ValueError(f"{reader.data.filename} uses rope scaling {scaling!r}; only none and 'linear' convert")
    rope_scaling = ({"rope_type": "linear", "factor": float(hp("rope.scaling.factor"))}
                    if scaling == "linear" else None)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": len(tok("tokens")), "hidden_size": hidden,
        "intermediate_size": hp("feed_forward_length"), "num_hidden_layers": hp("block_count"),
        "num_attention_heads": n_heads, "num_key_value_heads": hp("attention.head_count_kv"),
        "head_dim": _meta(reader, "llama.attention.key_length", hidden // n_heads), "hidden_act": "silu",
        # GGUF stores eps as float32 (9.99999974e-06); the shortest float32 repr gives back 1e-05.
        "rms_norm_eps": float(str(np.float32(hp("attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(_meta(reader, "llama.rope.freq_base", 10000.0)), "rope_scaling": rope_scaling,
        "max_position_embeddings": hp("context_length"), "attention_bias": False, "mlp_bias": False,
        # no output.weight tensor: the lm head reuses the embeddings
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors), "torch_dtype": "float32",
        "bos_token_id": tok("bos_token_id"), "eos_token_id": tok("eos_token_id"),
        "pad_token_id": _meta(reader, "tokenizer.ggml.padding_token_id", None),
    }


def hf_name(name: str) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight', through hf.py's one table."""
    top = {g: hf for parts in TOP_MODULES.values() for hf, g in parts}
    layer = {g: hf for parts in LAYER_MODULES.values() for hf, g in parts}
    parts = name.split(".")
    if len(parts) == 2 and parts[0] in top:
        return f"{top[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in layer:
        return f"model.layers.{parts[1]}.{layer[parts[2]]}.{parts[3]}"
    raise ValueError(f"GGUF tensor {name!r} has no llama counterpart in HF naming")


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: it interleaves each head's two rotary halves (HF's
    rotate_half layout) into pairs, w.reshape(n_head, 2, D/2, ...).swapaxes(1, 2)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(reader, config: dict, progress: Progress) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Every tensor dequantized to fp32, renamed, in HF [out, in] layout; and the Q4_1 / Q8_0 tensors' own
    blocks, as engine/weights.py's canonical Blocks hold them (q4: values 0..15 with d and m; int8: q and d):
    '<hf name>.q4.q' / '.q4.d' / '.q4.m' and '<hf name>.int8.q' / '.int8.d'."""
    from gguf.quants import dequantize

    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out, blocks, total = {}, {}, len(reader.tensors)
    for i, t in enumerate(reader.tensors, 1):
        # GGUF lists dims fastest-first ([in, out]); the numpy data is already row-major [out, in].
        shape = tuple(reversed(t.shape.tolist()))
        w = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else None
        kept = block_arrays(t.data, int(t.tensor_type), shape)
        if kind in heads:  # rows are whole blocks' worth of one output each: permuting rows keeps the blocks
            w = unpermute(w, heads[kind])
            kept = {k: unpermute(v, heads[kind]) for k, v in kept.items()}
        out[hf_name(t.name)] = np.ascontiguousarray(w)
        blocks.update({f"{hf_name(t.name)}.{k}": np.ascontiguousarray(v) for k, v in kept.items()})
        if i % 32 == 0 or i == total:
            progress(f"decodescope: dequantized {i}/{total} tensors")
    return out, blocks


def block_arrays(data: np.ndarray, qtype: int, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """A Q4_1 or Q8_0 tensor's raw bytes [out, bytes per row] -> its blocks per output row ({} otherwise).

    Q4_1 block (20 bytes): fp16 d, fp16 m, 16 bytes of nibbles (byte j: element j low, element j + 16 high).
    Q8_0 block (34 bytes): fp16 d, 32 int8."""
    if qtype not in (Q4_1, Q8_0) or len(shape) != 2:
        return {}
    rows = np.asarray(data, np.uint8).reshape(shape[0], -1, 20 if qtype == Q4_1 else 34)
    d = rows[..., 0:2].copy().view(np.float16)[..., 0]
    if qtype == Q8_0:
        return {"int8.q": rows[..., 2:].copy().view(np.int8).reshape(shape[0], -1), "int8.d": d}
    m = rows[..., 2:4].copy().view(np.float16)[..., 0]
    nib = rows[..., 4:]
    q = np.concatenate([nib & 0xF, nib >> 4], axis=-1)  # [out, nb, 32]: elements 0..15, then 16..31
    return {"q4.q": q.reshape(shape[0], -1), "q4.d": d, "q4.m": m}


REBUILT_TOKENIZERS = {("gpt2", "smollm"): "SmolLM2's byte-level BPE"}


def check_tokenizer(reader) -> None:
    """Fail before any tensor is read when the file's tokenizer is not one rebuilt here."""
    model = _meta(reader, "tokenizer.ggml.model", None)
    pre = _meta(reader, "tokenizer.ggml.pre", None)
    if (model, pre) not in REBUILT_TOKENIZERS:
        known = ", ".join(f"{name} (model={m!r}, pre={p!r})" for (m, p), name in REBUILT_TOKENIZERS.items())
        raise ValueError(f"{reader.data.filename} has tokenizer model={model!r} pre={pre!r}, which decodescope "
                         f"cannot rebuild from GGUF metadata (it rebuilds {known}); load the model from its "
                         "HF folder or hub id instead, which ships tokenizer.json")


def build_tokenizer(reader) -> Tokenizer:
    """SmolLM2's byte-level BPE, rebuilt from the vocab and merges in the GGUF metadata."""
    check_tokenizer(reader)
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ")) for m in _meta(reader, "tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    # SmolLM2's own tokenizer.json: every digit alone, then GPT-2's byte-level split.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)  # adds no bos: add_bos_token is false
    types = _meta(reader, "tokenizer.ggml.token_type")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types, strict=True) if kind == CONTROL])
    return tok


def tokenizer_config(reader) -> dict:
    """tokenizer_config.json: special tokens by name, the bos flag and the chat template from the file."""
    tokens = _meta(reader, "tokenizer.ggml.tokens")

    def name(key):
        i = _meta(reader, f"tokenizer.ggml.{key}", None)
        return None if i is None else tokens[i]

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_meta(reader, "tokenizer.ggml.add_bos_token", False)), "add_eos_token": False,
        "bos_token": name("bos_token_id"), "eos_token": name("eos_token_id"),
        "pad_token": name("padding_token_id"), "unk_token": name("unknown_token_id"),
        "clean_up_tokenization_spaces": False, "model_max_length": _meta(reader, "llama.context_length"),
        "chat_template": _meta(reader, "tokenizer.chat_template", None),
    }


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")

