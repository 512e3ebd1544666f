"""The model families decodescope runs, one recipe per module (recipe.py says what a recipe holds).

Every module in this package that defines FAMILY is registered by its model_type; a GGUF file finds its
family by llama.cpp's architecture name. Adding a family is a module here and its test: nothing else lists them.
"""
from __future__ import annotations

import importlib
import pkgutil

from engine.families.recipe import Family


def _discover() -> dict[str, Family]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        family = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FAMILY", None)
        if family is not None:
            found[family.model_type] = family
    return dict(sorted(found.items()))


FAMILIES: dict[str, Family] = _discover()
GGUF_ARCHS: dict[str, Family] = {f.gguf_arch: f for f in FAMILIES.values() if f.gguf_arch}


def supported() -> str:
    """One line naming every family and what it covers, for messages."""
    return "; ".join(f"{name} ({f.covers})" for name, f in FAMILIES.items())


def get(model_type) -> Family | None:
    return FAMILIES.get(model_type)


__all__ = ["FAMILIES", "GGUF_ARCHS", "Family", "get", "supported"]
