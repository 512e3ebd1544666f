"""The model cache: where converted checkpoints live, and the one way a folder gets there.

A folder is built in a temp folder beside it, under a file lock, its marker written last, then renamed into
place: two processes never build it at once, and a crash never leaves a half folder where a finished one is
looked for (a temp folder a crash left behind is removed by the next build, which holds the lock).

    folder = store.cache_dir() / "my-model"
    with store.locked(folder, progress):
        if store.marker(folder) is None:
            store.build(folder, lambda tmp: convert(src, tmp), {"version": 2})
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

CACHE_ENV = "DECODESCOPE_CACHE"
MARKER = ".complete"  # written last; a folder without it was not finished by us

Progress = Callable[[str], None]


def cache_dir(override: str | Path | None = None) -> Path:
    """The cache root: the argument, else $DECODESCOPE_CACHE, else ~/.cache/decodescope."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "decodescope"


def marker(folder: Path) -> dict | None:
    """The marker a finished build left in `folder`, or None."""
    path = folder / MARKER
    return json.loads(path.read_text() or "{}") if path.exists() else None


@contextmanager
def locked(folder: Path, progress: Progress) -> Iterator[None]:
    """Hold the lock that guards `folder` (a file beside it), saying so when another process holds it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder.parent / f".{folder.name}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(f"decodescope: waiting for another process preparing {folder}")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def build(folder: Path, make: Callable[[Path], None], info: dict) -> None:
    """Make `folder` with make(tmp) in a temp folder, write the marker (`info`) and rename it into place,
    replacing what stood there. Call with the lock held."""
    root = folder.parent
    for stale in root.glob(f"{folder.name}.tmp-*"):  # left by a crashed build; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f"{folder.name}.tmp-{os.getpid()}"
    tmp.mkdir(parents=True)
    try:
        make(tmp)
        (tmp / MARKER).write_text(json.dumps(info) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
