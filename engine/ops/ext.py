"""The one place csrc/ is compiled: a lazy JIT build (ninja), cached by target and source hash, under a file lock.

Two targets share the mechanism: "cpu" (csrc/cpu/*.cpp, the host compiler, SIMD picked at run time inside
the module) and "cuda" (nvcc for csrc/cuda/kernels.cu plus the torch-facing host files). `load(target)` never
raises for the expected reasons the kernels cannot run (no device, DECODESCOPE_NO_EXT=1, no compiler or
CUDA toolkit, a bad arch list, a failed build); it returns an ExtStatus whose `.reason` says which, and the
caller runs the torch twins. `python -m engine.ops.ext build [--target cpu|cuda|all]` builds ahead of time.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from filelock import FileLock

log = logging.getLogger("decodescope.ext")

# In an installed package the kernel sources ship inside it (engine/csrc); in a source checkout they sit
# beside engine/.
_ENGINE = Path(__file__).resolve().parent.parent
CSRC = next((p for p in (_ENGINE / "csrc", _ENGINE.parent / "csrc") if p.is_dir()), _ENGINE.parent / "csrc")
CACHE_ENV = "DECODESCOPE_EXT_CACHE"  # compiled extensions; models live under DECODESCOPE_CACHE
CUDA_SOURCES = ("kernels.cu", "ops.cpp", "ops_attention.cpp", "bindings.cpp")
DEFAULT_ARCHS = ("8.0", "8.6", "8.9", "9.0", "12.0")  # when no device is visible to ask
MIN_ARCH = (7, 5)  # the oldest compute capability nvcc 13 builds for
# The CPU module picks its instruction set at run time (csrc/cpu/isa.h), so no -march here: one build
# serves every x86-64 CPU. No -fopenmp either: threads come from torch's own pool (at::parallel_for).
CPU_FLAGS = ["-O3", "-std=c++20"]  # C++20 for designated initializers (the kernel tables, the format records)
CXX_FLAGS = ["-O3"]
CUDA_FLAGS = ["-O3", "-lineinfo"]  # line info costs nothing at run time and lets Nsight map time to source
# The C++ runtime torch already loaded, by its file name: a compiler whose own folders hold only the static
# libstdc++.a (the H200 image's CXX is a wrapper passing -B/opt/gcc/lib/gcc/x86_64-linux-gnu/13/) links a second
# runtime into the module, whose streams cannot format a number: every error message naming a size crashed the
# process. -lstdc++ would find that archive first; -l:libstdc++.so.6 names the shared one. Linux (glibc) only.
LINK_FLAGS = ("-l:libstdc++.so.6",) if sys.platform.startswith("linux") else ()
TARGETS = ("cpu", "cuda")


@dataclass(frozen=True)
class ExtStatus:
    module: ModuleType | None  # the compiled extension, or None when the torch twins must run
    reason: str  # "fused CPU kernels ..." / "fused CUDA kernels ..." or why not
    build_s: float | None = None  # seconds spent in the build step (near zero when the cache was warm)


class ArchListError(ValueError):
    """TORCH_CUDA_ARCH_LIST holds an entry nvcc would reject; the message names it."""


def arch_list() -> list[str]:
    """TORCH_CUDA_ARCH_LIST if set, else the visible devices' compute capabilities, else DEFAULT_ARCHS.

    Entries are checked here, before a minute of nvcc: 'X.Y' or 'X.Y+PTX', at least sm_75."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(" ", ";")
    if env.strip(";") and env != "native":
        archs = [a for a in env.split(";") if a]
        for a in archs:
            m = re.fullmatch(r"(\d+)\.(\d+)(\+PTX)?", a)
            if m is None:
                raise ArchListError(f"TORCH_CUDA_ARCH_LIST entry {a!r} is not of the form 8.0 or 9.0+PTX "
                                    "(named archs such as 'Hopper' are not accepted); fix or unset it")
            if (int(m[1]), int(m[2])) < MIN_ARCH:
                raise ArchListError(f"TORCH_CUDA_ARCH_LIST entry {a!r} is older than sm_75, which nvcc 13 no "
                                    "longer builds; drop it")
        return archs
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
    return Path(os.environ.get(CACHE_ENV, "~/.cache/decodescope/ext")).expanduser()


def sources(target: str, csrc: Path) -> list[Path]:
    if target == "cpu":
        return sorted((csrc / "cpu").glob("*.cpp"))
    return [csrc / "cuda" / s for s in CUDA_SOURCES]


def source_hash(target: str, csrc: Path) -> str:
    """Hash of every file under csrc/ (both targets' sources and the headers they may share) and of what
    else makes a binary incompatible. A CUDA-only edit also rebuilds the CPU module: a rare half minute."""
    flags = (CPU_FLAGS if target == "cpu" else CXX_FLAGS + CUDA_FLAGS) + list(LINK_FLAGS)
    h = hashlib.sha256(f"{target} torch={torch.__version__} cuda={torch.version.cuda} {flags}".encode())
    for f in sorted(p for p in csrc.rglob("*") if p.is_file()):
        h.update(f.relative_to(csrc).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def build_dir(target: str, archs: list[str], csrc: Path) -> Path:
    tag = "cpu" if target == "cpu" else "_".join("sm" + a.replace(".", "").replace("+PTX", "ptx") for a in archs)
    return cache_root() / f"{tag}-{source_hash(target, csrc)}"


def toolkit_problem(target: str) -> str | None:
    """Why this machine cannot compile the target, or None."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return (f"no C++ compiler ({cxx!r} is not on PATH); install one (build-essential, or packages.txt on "
                "a Space) to build the kernels")
    if target == "cpu":
        return None
    if torch.version.cuda is None:
        return (f"torch {torch.__version__} is a CPU build (torch.version.cuda is None), so it cannot build "
                "CUDA extensions; install a CUDA build of torch")
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None or not (Path(cpp_extension.CUDA_HOME) / "bin" / "nvcc").exists():
        return f"no CUDA toolkit found (CUDA_HOME={cpp_extension.CUDA_HOME}); put nvcc on PATH or set CUDA_HOME"
    return None


def compiler_error(text: str, max_lines: int = 6) -> str:
    """The first error lines of a compiler's output (or its last lines when none says 'error')."""
    text = re.sub(r"^Error building extension '[^']*':?\s*", "", text)  # cpp_extension's prefix
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return "\n".join((errors or lines[-max_lines:])[:max_lines])


def _compile(target: str, name: str, directory: Path, archs: list[str], csrc: Path, verbose: bool) -> ModuleType:
    """cpp_extension.load appends torch's libraries to the flag lists it is given, in place: it gets copies, or the
    next build_dir in this process would hash different flags and build the module a second time."""
    from torch.utils import cpp_extension

    if target == "cpu":
        return cpp_extension.load(name=name, sources=[str(s) for s in sources("cpu", csrc)],
                                  extra_cflags=list(CPU_FLAGS), extra_ldflags=list(LINK_FLAGS),
                                  extra_include_paths=[str(csrc)], build_directory=str(directory), verbose=verbose)
    return cpp_extension.load(
        name=name,
        sources=[str(s) for s in sources("cuda", csrc)],
        extra_cflags=list(CXX_FLAGS),
        extra_cuda_cflags=CUDA_FLAGS + gencode_flags(archs),
        extra_ldflags=list(LINK_FLAGS),
        extra_include_paths=[str(csrc / "cuda")],
        build_directory=str(directory),
        verbose=verbose,
    )


def _import_built(path: Path) -> ModuleType | None:
    """A finished build, imported as cpp_extension.load imports it but without its build machinery (setuptools,
    ~5 MB of a CPU process's RSS, and a ninja run that finds nothing to do); None where there is none, or a link
    cut short left a file that does not load (then built again). The folder's name holds the hash of the sources
    and flags, so a module in it is that build's."""
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(path.stem, path)
    try:
        module = importlib.util.module_from_spec(spec)  # dlopen
        spec.loader.exec_module(module)
    except ImportError:
        return None
    return module


def _heartbeat(stop: threading.Event, started: float, what: str) -> None:
    while not stop.wait(15.0):
        log.warning("still building %s kernels (%.0f s)", what, time.perf_counter() - started)


def build(target: str = "cuda", csrc: Path | None = None, verbose: bool = False) -> ExtStatus:
    """Compile (or reuse) the target's extension; no device needed. Never raises for a failed build."""
    csrc = csrc or CSRC
    what = target.upper()
    if os.environ.get("DECODESCOPE_NO_EXT") == "1":
        return ExtStatus(None, f"DECODESCOPE_NO_EXT=1: fused {what} kernels switched off")
    if not sources(target, csrc) or not all(s.is_file() for s in sources(target, csrc)):
        return ExtStatus(None, f"the {what} kernel sources are missing from {csrc}; reinstall decodescope")
    problem = toolkit_problem(target)
    if problem:
        return ExtStatus(None, problem)
    try:
        archs = arch_list() if target == "cuda" else []
    except ArchListError as e:
        return ExtStatus(None, str(e))
    directory = build_dir(target, archs, csrc)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"decodescope_{target}_" + directory.name.rsplit("-", 1)[1]
    started = time.perf_counter()
    stop = threading.Event()
    with FileLock(directory / "build.lock"):  # a second process waits here, then finds the build done
        # torch's own `lock` file outlives a build that was killed, and its loader then waits on it forever;
        # holding our lock, no build of ours is running, so a leftover one is stale.
        (directory / "lock").unlink(missing_ok=True)
        try:
            module = _import_built(directory / f"{name}.so")
            if module is None:
                # A warning so that it shows without logging set up: the caller is about to wait.
                log.warning("building %s kernels%s into %s (the first build takes about a minute)", what,
                            f" for {';'.join(archs)}" if archs else "", directory)
                threading.Thread(target=_heartbeat, args=(stop, started, what), daemon=True).start()
                module = _compile(target, name, directory, archs, csrc, verbose)
        except (RuntimeError, OSError, ImportError, subprocess.CalledProcessError) as e:
            return ExtStatus(None, f"{what} kernel build failed (build dir {directory}):\n{compiler_error(str(e))}")
        finally:
            stop.set()
    seconds = time.perf_counter() - started
    log.info("%s kernels ready in %.1f s (%s)", what, seconds, directory)
    detail = ";".join(archs) if archs else module.isa()
    return ExtStatus(module, f"fused {what} kernels ({detail})", seconds)


@functools.cache
def load(target: str = "cuda") -> ExtStatus:
    """The target's extension for this process, built on first use; memoized (tests reset it with
    load.cache_clear())."""
    if target not in TARGETS:
        raise ValueError(f"target={target!r} is not one of {TARGETS}")
    if os.environ.get("DECODESCOPE_NO_EXT") == "1":
        return ExtStatus(None, f"DECODESCOPE_NO_EXT=1: fused {target.upper()} kernels switched off")
    if target == "cuda" and not torch.cuda.is_available():
        return ExtStatus(None, "no CUDA device")
    status = build(target)
    if target == "cpu" and status.module is not None and (why := status.module.unsupported()):
        return ExtStatus(None, why, status.build_s)  # built, but this CPU lacks what the kernels need
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.ops.ext", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build"], help="build the kernels ahead of time")
    parser.add_argument("--target", choices=[*TARGETS, "all"], default="all",
                        help="which kernels (default: all; a CPU-only torch reports why CUDA cannot build)")
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ok = True
    for target in TARGETS if args.target == "all" else (args.target,):
        status = build(target, verbose=args.verbose)
        print(f"{target}: {status.reason}" + (f" ({status.build_s:.1f} s)" if status.build_s is not None else ""))
        ok &= status.module is not None
    print(f"cache: {cache_root()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
