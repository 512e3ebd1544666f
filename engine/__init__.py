"""decodescope's runtime: a llama-family engine with a static KV cache, fused kernels, CUDA graphs and
speculative decoding. Public API in DESIGN.md: load_model, Tokenizer, Engine, graphs, speculative."""
import os

# By default idle OpenMP threads spin. A CPU decode step alternates MKL's matmuls with ATen's elementwise
# ops, two thread pools on the same cores, so each spins while the other needs the core: a SmolLM2 step
# on 2 cores took 100-250 ms spinning and ~60 ms with passive waits. It only takes effect when engine is
# imported before torch, which is why the entry points import engine first.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine.engine import Engine
from engine.loader import ModelLoadError, load_model


def __getattr__(name):
    # Tokenizer, graphs and speculative import lazily so `import engine` stays cheap.
    import importlib

    if name == "Tokenizer":
        return importlib.import_module("engine.tokenizer").Tokenizer
    if name in ("graphs", "speculative", "sampling", "stats", "testing"):
        return importlib.import_module(f"engine.{name}")
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = ["Engine", "ModelLoadError", "load_model", "Tokenizer", "graphs", "speculative"]
