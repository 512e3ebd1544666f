"""decodescope's runtime: a llama-family engine with a static KV cache, fused kernels, CUDA graphs and
speculative decoding. Public API in DESIGN.md: load_model, Tokenizer, Engine, graphs, speculative."""
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
