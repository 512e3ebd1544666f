"""Whether a model fits before it loads: the bytes its chosen formats take against the memory this machine has left.

A load that cannot fit is refused before a tensor is read, naming both figures, instead of dying inside numpy or
the OOM killer halfway through. The need is the packed weights (each projection at its chosen format's bytes, an
untied embedding at its file's or its dtype's, the norms in fp32) plus the largest tensor's transient buffers while
it is packed (its file bytes, its canonical blocks and its packed copy). The KV cache comes on top, with the Engine.
"""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path

from engine.checkpoint.hf import ModelLoadError

GiB = 1 << 30


def available_bytes() -> int | None:
    """MemAvailable (Linux), lowered to a cgroup's limit where one is set; None where neither can be read."""
    have = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                have = int(line.split()[1]) * 1024
    except OSError:
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max" and have is not None:
            have = min(have, int(limit) - used)
    except (OSError, ValueError):
        pass
    return have


@functools.cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; musl and macOS have none
    except (OSError, AttributeError):
        return None


def release() -> None:
    """Hand the pages of freed heap memory back to the OS. A load frees buffers (a tensor's bytes while it is
    packed, the tokenizer's parse) between the weights it keeps, and glibc returns only the top of its heap by
    itself: the holes stay in RSS, and add up to the load's peak (~50 MB on a 1.5B model). malloc_trim(0) releases
    the free pages wherever they lie; a no-op where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def stored_bytes(src, name: str) -> int:
    """A tensor's bytes in its file (a safetensors tensor counted at 4 bytes a value: an upper bound)."""
    if hasattr(src, "nbytes"):
        return src.nbytes(name)
    n = 1
    for d in src.shapes[name]:
        n *= d
    return 4 * n


def need_bytes(plan, targets: dict, src, embed: list[str] | None, blocks_embed: bool, embed_bytes: int) -> dict:
    """{"weights": packed bytes, "transient": the largest tensor's buffers while packed}; embed_bytes: a value of a
    dense untied embedding's dtype."""
    weights, transient = 0, 0
    for ours, (names, shape, _) in targets.items():
        packed = plan.nbytes(ours, shape)
        weights += packed
        transient = max(transient, sum(stored_bytes(src, n) for n in names) + shape[0] * shape[1] + packed)
    if embed is not None:
        rows, cols = src.shapes[embed[0]]
        weights += stored_bytes(src, embed[0]) if blocks_embed else rows * cols * embed_bytes
    weights += sum(4 * s[0] for s in src.shapes.values() if len(s) == 1)
    return dict(weights=weights, transient=transient)


def check_fits(folder: Path, plan, targets, src, embed, blocks_embed, embed_dtype) -> None:
    import torch

    need = need_bytes(plan, targets, src, embed, blocks_embed, torch.empty(0, dtype=embed_dtype).element_size())
    total, have = need["weights"] + need["transient"], available_bytes()
    if have is not None and total > have:
        raise ModelLoadError(
            f"{getattr(src, 'path', folder)} needs about {total / GiB:.2f} GiB of memory to load ({total:,} bytes: "
            f"{need['weights'] / GiB:.2f} GiB of weights in {plan.fmt} and the formats load_notes would name, and "
            f"{need['transient'] / GiB:.2f} GiB while its largest tensor is packed), and this machine has "
            f"{have / GiB:.2f} GiB available ({have:,} bytes). Close other programs, or load a smaller "
            "quantization of the model (a Q4_K_M file, or weights='q4')")
