"""What this machine has for the GPU check, before a minute is spent on a build: torch and its CUDA, a
visible device, nvcc, ninja, a host C++ compiler, Python.h and pytest, an arch list that covers the device, disk.
A build without any of them fails, and every later step would run the torch twins instead of the kernels.
Writes JSON; the last line printed says whether the check can go on, and if not, why. No network.

    python -m bench.preflight OUT.json     # exit 0: ready; 1: not, with the reason
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch


def _version(cmd: list[str], line: int = -1) -> str | None:
    """One line of a tool's version output: nvcc puts its version last, gcc first."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[line] if out else None


def covers(archs: list[str], capability: tuple[int, int]) -> bool:
    """Whether a build for `archs` runs on a device of this compute capability: its own machine code, or PTX of
    an older arch that the driver compiles for it."""
    for arch in archs:
        major, minor = (int(n) for n in arch.removesuffix("+PTX").split("."))
        if (major, minor) == capability or (arch.endswith("+PTX") and (major, minor) <= capability):
            return True
    return False


def python_header() -> str | None:
    """Python.h where the extension's build looks for it (torch's cpp_extension includes Python's own headers)."""
    path = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return str(path) if path.is_file() else None


def check() -> tuple[dict, str | None]:
    """(facts, the reason the GPU check cannot run here or None)."""
    from torch.utils import cpp_extension

    from engine.ops import ext

    facts = dict(python=sys.version.split()[0], torch=torch.__version__, torch_cuda=torch.version.cuda,
                 cuda_home=cpp_extension.CUDA_HOME, nvcc=_version(["nvcc", "--version"]),
                 ninja=_version(["ninja", "--version"]),
                 cxx=_version([os.environ.get("CXX", "c++"), "--version"], line=0), python_h=python_header(),
                 nvidia_smi=_version(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                      "--format=csv,noheader"]),
                 pytest=importlib.util.find_spec("pytest") is not None,
                 transformers=importlib.util.find_spec("transformers") is not None,
                 arch_list_env=os.environ.get("TORCH_CUDA_ARCH_LIST"),
                 arch_list_preset=os.environ.get("GPU_CHECK_PRESET_ARCH_LIST"),  # what the machine had set
                 tmp_free_gb=round(shutil.disk_usage(tempfile.gettempdir()).free / 2**30, 1))
    if torch.version.cuda is None:
        return facts, f"torch {torch.__version__} is a CPU build: install a CUDA build of torch"
    if not torch.cuda.is_available():
        return facts, f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    props = torch.cuda.get_device_properties(0)
    facts.update(gpu=props.name, capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                 memory_gib=round(props.total_memory / 2**30, 1))
    try:
        facts["archs"] = ext.arch_list()
    except ext.ArchListError as e:
        return facts, str(e)
    if not covers(facts["archs"], (props.major, props.minor)):
        return facts, (f"the kernels would build for {';'.join(facts['archs'])}, which cannot run on this "
                       f"{props.major}.{props.minor} device; set TORCH_CUDA_ARCH_LIST (or GPU_CHECK_ARCH for "
                       f"scripts/gpu_check.sh) to {props.major}.{props.minor}")
    missing = [name for name in ("nvcc", "ninja", "pytest") if not facts[name]]
    if not facts["cxx"]:
        missing.append(f"a host C++ compiler ({os.environ.get('CXX', 'c++')!r} is not on PATH; install g++)")
    if not facts["python_h"]:
        missing.append(f"Python.h (not in {sysconfig.get_paths()['include']}; install python3-dev for this "
                       f"Python, {sys.version.split()[0]})")
    if missing:
        return facts, f"missing {', '.join(missing)}: the build or the tests cannot run"
    return facts, None


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:] or ["preflight.json"])[0])
    facts, problem = check()
    facts["ready"], facts["problem"] = problem is None, problem
    out.write_text(json.dumps(facts, indent=2) + "\n")
    for key, value in facts.items():
        print(f"{key}: {value}")
    print("ready: the GPU check goes on" if problem is None else f"not ready: {problem}")
    return 0 if problem is None else 1


if __name__ == "__main__":
    sys.exit(main())
