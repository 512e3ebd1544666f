"""A GGUF file -> the small folder the loader reads it through: config, tokenizer and an index of its tensors.

The file's general.architecture names its family (engine/families/: llama, qwen2, qwen3, gemma2, gemma3, phi3);
its metadata becomes that family's config.json, its tokenizer a tokenizer.json (gguf_tokenizer.py) with the facts
a load needs of it (tokenizer.write_facts), and gguf.json indexes every tensor by its HF name (its GGUF name, type,
offset and shape). No weight is written: the loader reads each tensor from the file itself and packs its blocks
straight into the kernels' layouts (sources.py, formats.py), so the folder costs a few MB whatever the model's
size.

    convert(Path("model.gguf"), Path("out/"))
    folder = cached(Path("model.gguf"))   # <cache>/gguf/model-<key>/, indexed on the first call only

A file we cannot read fails before anything is written: an architecture, a tokenizer, a rope scaling or a tensor
type we do not run (IQ-quants), a truncated or corrupt file, a vocabulary that does not match the embeddings;
each names the file.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np

from engine import families, tokenizer
from engine import weights as wts
from engine.checkpoint import gguf_header, gguf_tokenizer, store
from engine.checkpoint.sources import INDEX_FILE
from engine.checkpoint.store import Progress
from engine.families import Family

# Bump when the conversion changes: cached folders carry it (their names, or their markers), so a new
# converter rebuilds them and two versions of decodescope sharing a cache never rebuild each other's.
# 2: the GGUF blocks are kept; 3: every family, K-quant blocks; 4: read in place; 5: no re-quantized stand-ins in
# the folder (a merged projection's parts run in their own formats): the rebuild removes the old folder and its file;
# 6: the tokenizer's facts kept beside it (a load parses no tokenizer)
CONVERTER_VERSION = 6
MISSING = object()
HEAD_BYTES = 1 << 20  # hashed into a file's cache key: its header (metadata, then the tensors' index) starts there


class GGUFError(ValueError):
    """A GGUF file we cannot convert; the message names the file, the value and what to do."""


class Meta:
    """A GGUF file's metadata by key: meta("tokenizer.ggml.tokens"), meta.hp("block_count") for "<arch>.<key>"."""

    def __init__(self, header: gguf_header.Header, path: Path):
        self.header, self.tensors, self.path = header, header.tensors, path
        self.arch = self("general.architecture")

    def __call__(self, key: str, default=MISSING):
        value = self.header.fields.get(key, MISSING)
        if value is MISSING:
            if default is not MISSING:
                return default
            raise GGUFError(f"{self.path} has no GGUF metadata key {key!r}; the file is incomplete or not a model "
                            "GGUF: download it again, or load the model's HF folder")
        return value

    def hp(self, key: str, default=MISSING):
        return self(f"{self.arch}.{key}", default)


def open_gguf(path: Path) -> gguf_header.Header:
    """The file's header, with every tensor's bytes inside the file; a corrupt or truncated file fails here."""
    try:
        return gguf_header.read(path)
    except (ValueError, OSError) as e:
        raise GGUFError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); it is corrupt or "
                        "truncated: download it again") from None


def family_of(meta: Meta) -> Family:
    family = families.GGUF_ARCHS.get(meta.arch)
    if family is None:
        runs = ", ".join(sorted(families.GGUF_ARCHS))
        raise GGUFError(f"{meta.path} holds a {meta.arch!r} model; decodescope converts GGUF files of {runs}. "
                        f"Load its HF folder if its family is one of: {families.supported()}")
    return family


def convert(gguf_file: Path, out: Path, progress: Progress = print) -> None:
    """Write the folder a GGUF file loads through (config, tokenizer, the tensors' index) into `out`."""
    start = time.perf_counter()
    progress(f"decodescope: reading {gguf_file}")
    meta = Meta(open_gguf(gguf_file), gguf_file)
    family = family_of(meta)
    try:
        gguf_tokenizer.kind(meta, meta.arch)
    except gguf_tokenizer.TokenizerError as e:
        raise GGUFError(f"{gguf_file} has {e}") from None
    config = hf_config(meta, family)
    index = {"file": str(gguf_file.resolve()), "size": gguf_file.stat().st_size,
             "tensors": tensor_index(meta, family)}
    _write_json(out / INDEX_FILE, index)
    progress("decodescope: writing the tokenizer and configs")
    built = gguf_tokenizer.build(meta, meta.arch)
    built.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config(meta))
    _write_json(out / "config.json", config)
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    _write_json(out / "generation_config.json", {key: config.get(key) for key in ids})
    tokenizer.write_facts(out, built)  # so a load need not parse the tokenizer (tokenizer.facts)
    progress(f"decodescope: indexed {len(index['tensors'])} tensors of {gguf_file.name} in "
             f"{time.perf_counter() - start:.1f} s (they are read from the file itself at each load)")


def cached(gguf_file: Path, cache_dir: Path | None = None, progress: Progress = print) -> Path:
    """The folder of a GGUF file, writing it on the first call. The folder is keyed by the file's
    path, size, modification time and a hash of its first MiB, and the converter's version, so a changed file is
    converted again (and the folder of its previous version removed); a warm start reads that MiB and the
    folder's index, never the file's header."""
    gguf_file = Path(gguf_file).expanduser().resolve()
    st = gguf_file.stat()
    with gguf_file.open("rb") as f:  # a file rewritten in place with its size and time kept is still another file
        head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()[:16]
    source = f"{gguf_file}|{st.st_size}|{st.st_mtime_ns}|{head}|{CONVERTER_VERSION}"
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


def hf_config(meta: Meta, family: Family) -> dict:
    """config.json for the family from the <arch>.* metadata (llama.cpp's keys, read as transformers' GGUF loader
    reads them), refusing what would change the math silently."""
    hidden, n_heads, n_layers = meta.hp("embedding_length"), meta.hp("attention.head_count"), meta.hp("block_count")
    n_kv = meta.hp("attention.head_count_kv", n_heads)
    for name, value in (("attention.head_count", n_heads), ("attention.head_count_kv", n_kv)):
        if not isinstance(value, int):
            raise GGUFError(f"{meta.path} sets {meta.arch}.{name} per layer ({value}); decodescope runs one count")
    head_dim = meta.hp("attention.key_length", hidden // n_heads)
    rot = meta.hp("rope.dimension_count", head_dim)
    if rot != head_dim:
        raise GGUFError(f"{meta.path} rotates {rot} of each head's {head_dim} dims ({meta.arch}.rope.dimension_count)"
                        "; decodescope rotates whole heads only")
    tok = meta("tokenizer.ggml.tokens")
    config = {
        "architectures": [family.architecture], "model_type": family.model_type,
        "vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": meta.hp("feed_forward_length"),
        "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": n_kv,
        "head_dim": head_dim, family.act_key: "silu",
        # GGUF stores eps as float32 (9.99999974e-06); the shortest float32 repr gives back 1e-05.
        "rms_norm_eps": float(str(np.float32(meta.hp("attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(meta.hp("rope.freq_base", 10000.0)), "rope_scaling": rope_scaling(meta),
        "max_position_embeddings": meta.hp("context_length"),
        # no output.weight tensor: the lm head reuses the embeddings
        "tie_word_embeddings": all(t.name != "output.weight" for t in meta.tensors), "torch_dtype": "float32",
        "bos_token_id": meta("tokenizer.ggml.bos_token_id", None), "eos_token_id": meta("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta("tokenizer.ggml.padding_token_id", None),
    }
    config["attention_bias"] = any(t.name.endswith("attn_q.bias") for t in meta.tensors)
    window = meta.hp("attention.sliding_window", None)
    if window:
        config["sliding_window"] = window
    return config | family.gguf_extras(meta.hp, config)


def rope_scaling(meta: Meta) -> dict | None:
    """HF's rope_scaling from <arch>.rope.scaling.* or, for Llama 3.x, from its rope_freqs tensor."""
    kind = meta.hp("rope.scaling.type", None)
    freqs = next((t for t in meta.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None:
        if freqs.type != "F32":
            raise GGUFError(f"{meta.path} stores rope_freqs.weight as {freqs.type}; llama.cpp writes it as F32")
        return llama3_scaling(meta, np.fromfile(meta.path, np.float32, freqs.n_bytes // 4, offset=freqs.offset))
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta.hp("rope.scaling.factor"))}
    raise GGUFError(f"{meta.path} uses rope scaling {kind!r}; decodescope converts none, 'linear' and Llama 3's")


def llama3_scaling(meta: Meta, freqs: np.ndarray) -> dict:
    """Llama 3.x files store the per-frequency divisors of their rope scaling (rope_freqs); the parameters that
    give exactly those divisors, from the ones Llama 3.1 / 3.2 ship, or a refusal naming the tensor."""
    from engine.config import Rope

    head_dim = meta.hp("attention.key_length", meta.hp("embedding_length") // meta.hp("attention.head_count"))
    theta = float(meta.hp("rope.freq_base", 10000.0))
    factor = float(freqs.max())
    for old in (8192, meta.hp("rope.scaling.original_context_length", 8192)):
        scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": int(old)}
        plain = Rope(theta).inv_freq(head_dim, 0, 0)
        scaled = Rope(theta, tuple(sorted(scaling.items()))).inv_freq(head_dim, 0, 0)
        if np.allclose((plain / scaled).numpy(), freqs, rtol=1e-5):
            return scaling
    raise GGUFError(f"{meta.path}'s rope_freqs tensor is not Llama 3's rope scaling with factor {factor}; "
                    "load the model's HF folder instead")


def hf_name(name: str, family: Family | None = None) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight', through the family's tensor table."""
    family = family or families.FAMILIES["llama"]
    top = {g: hf for parts in family.top.values() for hf, g, _ in parts}
    layer = {g: hf for parts in family.layer.values() for hf, g, _ in parts}
    parts = name.split(".")
    if len(parts) == 2 and parts[0] in top:
        return f"{top[parts[0]]}.{parts[1]}"
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in layer:
        return f"model.layers.{parts[1]}.{layer[parts[2]]}.{parts[3]}"
    raise GGUFError(f"GGUF tensor {name!r} has no {family.model_type} counterpart in HF naming")


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: it interleaves each head's two rotary halves (HF's
    rotate_half layout) into pairs, w.reshape(n_head, 2, D/2, ...).swapaxes(1, 2)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


SKIPPED = ("rope_freqs.weight",)  # read into the config (rope_scaling), not a weight
DENSE = ("F32", "F16", "BF16")


def tensor_index(meta: Meta, family: Family) -> dict[str, list]:
    """{hf name: [gguf name, GGUF type, offset of its bytes, their count, HF shape [out, in]]} for every tensor,
    refusing a type no weight format of ours reads (IQ-quants among them) by the tensor's name and type."""
    vocab = len(meta("tokenizer.ggml.tokens"))
    out, unread = {}, []
    for t in meta.tensors:
        if t.name in SKIPPED:
            continue
        shape = list(reversed(t.shape))  # GGUF lists dims fastest-first ([in, out])
        if t.name.startswith("token_embd") and shape[0] != vocab:
            raise GGUFError(f"{meta.path}: the tokenizer lists {vocab} tokens but token_embd.weight has "
                            f"{shape[0]} rows; the file is inconsistent: download it again")
        if t.type not in DENSE and t.type not in wts.BY_GGUF:
            unread.append(f"{t.name} ({t.type})")
        out[hf_name(t.name, family)] = [t.name, t.type, t.offset, t.n_bytes, shape]
    if unread:
        iq = " (IQ-quants are not read)" if any("(IQ" in u for u in unread) else ""
        raise GGUFError(f"{meta.path} stores {len(unread)} tensors in types decodescope does not read{iq}: "
                        f"{', '.join(unread[:4])}{' ...' if len(unread) > 4 else ''}. It reads "
                        f"{', '.join((*DENSE, *wts.BY_GGUF))}: requantize the file with llama.cpp's llama-quantize "
                        "(to Q4_K_M, Q6_K or Q8_0), or load the model's HF folder")
    return out


def tokenizer_config(meta: Meta) -> dict:
    """tokenizer_config.json: special tokens by name, the bos flag and the chat template from the file."""
    tokens = meta("tokenizer.ggml.tokens")

    def name(key):
        i = meta(f"tokenizer.ggml.{key}", None)
        return None if i is None else tokens[i]

    # a SentencePiece file that does not say adds a bos, as llama.cpp and transformers do
    bos = meta("tokenizer.ggml.add_bos_token", meta("tokenizer.ggml.model") == "llama")
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(bos), "add_eos_token": False,
        "bos_token": name("bos_token_id"), "eos_token": name("eos_token_id"),
        "pad_token": name("padding_token_id"), "unk_token": name("unknown_token_id"),
        "clean_up_tokenization_spaces": False, "model_max_length": meta.hp("context_length"),
        "chat_template": meta("tokenizer.chat_template", None),
    }


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
