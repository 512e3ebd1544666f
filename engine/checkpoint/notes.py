"""The load note a GGUF file gets: its format mix, and what runs as the file's own blocks against what was
converted (load_model prints it and keeps it first in model.load_notes; the page and the CLI show it)."""
from __future__ import annotations

from collections import Counter, defaultdict

from engine.checkpoint.formats import CONVERSIONS, KEPT_DENSE, holds, stored_format
from engine.weights import DENSE_DTYPES


def summary(src, plan, model) -> list[str]:
    if not hasattr(src, "index"):  # an HF folder: its dtype's format, nothing converted
        return []
    count, size = Counter(), Counter()
    for name in src.index:
        gtype = src.gguf_type(name)
        count[gtype] += 1
        size[gtype] += src.nbytes(name)
    mix = ", ".join(f"{t} {count[t]} tensors {size[t] / 1e6:,.0f} MB" for t in sorted(size, key=size.get, reverse=True))
    native, converted = defaultdict(int), defaultdict(int)
    for name, fmt in plan.choice.items():
        gtype, stored = src.gguf_type(name), stored_format(src, name)
        if stored is None:  # dense: in its own dtype where the kernels keep it (KEPT_DENSE)
            if KEPT_DENSE.get(gtype) == fmt:
                native[f"{gtype} as {fmt}"] += 1
            continue
        exact = holds(fmt, stored) or CONVERSIONS.get((stored, fmt), (None, "rounds"))[1] is None
        (native if exact else converted)[f"{gtype} as {fmt}"] += 1
    lines = [f"decodescope: {src.path.name} ({src.path.stat().st_size / 1e6:,.0f} MB): {mix}"]
    runs = "; ".join(f"{k} ({n})" for k, n in native.items()) or "none"
    lines.append(f"decodescope: runs the file's own blocks: {runs}"
                 + (f"; converted: {'; '.join(f'{k} ({n})' for k, n in converted.items())}" if converted else ""))
    embed = getattr(model.embed, "fmt", None)
    if embed is not None:
        lines[-1] += f"; the embedding stays in its {embed} blocks, a lookup decodes the rows it reads"
    elif model.embed is not None and model.embed.weight.dtype != model.dtype:
        kept = next(f for f, dt in DENSE_DTYPES.items() if dt == model.embed.weight.dtype)
        lines[-1] += f"; the embedding stays in {kept}, a lookup widens the rows it reads"
    return lines
