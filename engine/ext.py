"""The one place csrc/ is compiled: a lazy JIT build (ninja), cached by arch and source hash, under a file lock.

`load()` never raises for the expected reasons the kernels cannot run (no device, DECODESCOPE_NO_EXT=1, no
CUDA toolkit, a failed build); it returns an ExtStatus whose `.reason` says which, and the caller runs the
torch twins. `python -m engine.ext build` builds ahead of time.
"""
from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("decodescope.ext")

CSRC = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = ("kernels.cu", "ops.cpp", "ops_attention.cpp", "bindings.cpp")
DEFAULT_ARCHS = ("8.0", "8.6", "8.9", "9.0", "12.0")  # when no device is visible to ask
CXX_FLAGS = ["-O3"]
CUDA_FLAGS = ["-O3", "-lineinfo"]  # line info costs nothing at run time and lets Nsight map time to source


@dataclass(frozen=True)
class ExtStatus:
    module: ModuleType | None  # the compiled extension, or None when the torch twins must run
    reason: str  # "fused CUDA kernels ..." or why not
    build_s: float | None = None  # seconds spent in the build step (near zero when the cache was warm)


def arch_list() -> list[str]:
    """TORCH_CUDA_ARCH_LIST if set, else the visible devices' compute capabilities, else DEFAULT_ARCHS."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(" ", ";")
    if env.strip(";") and env != "native":
        return [a for a in env.split(";") if a]
    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return [f"{major}.{minor}" for major, minor in sorted(caps)]
    return list(DEFAULT_ARCHS)


def gencode_flags(archs: list[str]) -> list[str]:
    """'9.0' -> sm_90 code; '8.6+PTX' also embeds PTX for newer GPUs to JIT."""
    flags = []
    for arch in archs:
        num = arch.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return flags


def cache_root() -> Path:
    return Path(os.environ.get("DECODESCOPE_CACHE", "~/.cache/decodescope")).expanduser() / "ext"


def source_hash(csrc: Path) -> str:
    """Hash of every file in csrc/ (headers included) and of what else makes a binary incompatible."""
    h = hashlib.sha256(f"torch={torch.__version__} cuda={torch.version.cuda} {CXX_FLAGS} {CUDA_FLAGS}".encode())
    for f in sorted(p for p in csrc.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def build_dir(archs: list[str], csrc: Path) -> Path:
    tag = "_".join("sm" + a.replace(".", "").replace("+PTX", "ptx") for a in archs)
    return cache_root() / f"{tag}-{source_hash(csrc)}"


def toolkit_problem() -> str | None:
    """Why this torch cannot compile CUDA code here, or None."""
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU build (torch.version.cuda is None), so it cannot build "
                "CUDA extensions; install a CUDA build of torch")
    if cpp_extension.CUDA_HOME is None or not (Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc").exists():
        return f"no CUDA toolkit found (CUDA_HOME={cpp_extension.CUDA_HOME}); put nvcc on PATH or set CUDA_HOME"
    return None


def compiler_error(text: str, max_lines: int = 6) -> str:
    """The first error lines of a compiler's output (or its last lines when none says 'error')."""
    text = re.sub(r"^Error building extension '[^']*':?\s*", "", text)  # cpp_extension's prefix
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return "\n".join((errors or lines[-max_lines:])[:max_lines])


def _compile(name: str, directory: Path, archs: list[str], csrc: Path, verbose: bool) -> ModuleType:
    from torch.utils import cpp_extension

    return cpp_extension.load(
        name=name,
        sources=[str(csrc / s) for s in SOURCES],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=CUDA_FLAGS + gencode_flags(archs),
        extra_include_paths=[str(csrc)],
        build_directory=str(directory),
        verbose=verbose,
    )


def _heartbeat(stop: threading.Event, started: float) -> None:
    while not stop.wait(15.0):
        log.info("still building CUDA kernels (%.0f s)", time.perf_counter() - started)


def build(csrc: Path | None = None, verbose: bool = False) -> ExtStatus:
    """Compile (or reuse) the extension for arch_list(); no device needed. Never raises for a failed build."""
    csrc = csrc or CSRC
    if os.environ.get("DECODESCOPE_NO_EXT") == "1":
        return ExtStatus(None, "DECODESCOPE_NO_EXT=1: fused CUDA kernels switched off")
    problem = toolkit_problem()
    if problem:
        return ExtStatus(None, problem)
    archs = arch_list()
    directory = build_dir(archs, csrc)
    directory.mkdir(parents=True, exist_ok=True)
    name = "decodescope_ops_" + directory.name.rsplit("-", 1)[1]
    started = time.perf_counter()
    stop = threading.Event()
    with open(directory / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the build done
        try:
            if not any(directory.glob(f"{name}*.so")):
                # A warning so that it shows without logging set up: the caller is about to wait a minute.
                log.warning("building CUDA kernels for %s into %s (the first build takes about a minute)",
                            ";".join(archs), directory)
                threading.Thread(target=_heartbeat, args=(stop, started), daemon=True).start()
            module = _compile(name, directory, archs, csrc, verbose)
        except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as e:
            return ExtStatus(None, f"CUDA kernel build failed (build dir {directory}):\n{compiler_error(str(e))}")
        finally:
            stop.set()
            fcntl.flock(lock, fcntl.LOCK_UN)
    seconds = time.perf_counter() - started
    log.info("CUDA kernels ready in %.1f s (%s)", seconds, directory)
    return ExtStatus(module, f"fused CUDA kernels ({';'.join(archs)})", seconds)


@functools.lru_cache(maxsize=None)
def load() -> ExtStatus:
    """The extension for this process, built on first use; memoized (tests reset it with load.cache_clear())."""
    if os.environ.get("DECODESCOPE_NO_EXT") == "1":
        return ExtStatus(None, "DECODESCOPE_NO_EXT=1: fused CUDA kernels switched off")
    if not torch.cuda.is_available():
        return ExtStatus(None, "no CUDA device")
    return build()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.ext", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build"], help="build the CUDA kernels ahead of time")
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    status = build(verbose=args.verbose)
    print(f"archs: {';'.join(arch_list())}\ncache: {cache_root()}\nstatus: {status.reason}")
    if status.build_s is not None:
        print(f"build_s: {status.build_s:.1f}")
    return 0 if status.module is not None else 1


if __name__ == "__main__":
    sys.exit(main())
