"""The one error a load raises for a checkpoint it cannot read (every module of checkpoint/ raises it)."""
from __future__ import annotations


class ModelLoadError(ValueError):
    """A model folder we cannot load; the message says what is wrong and what to do."""
