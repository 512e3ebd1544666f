"""A non-editable install: the wheel carries the kernel sources, and the installed package finds them and
runs its entry points from somewhere other than the source checkout."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.packaging


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project built as a wheel and installed (without dependencies: they are this venv's) into a folder."""
    tmp = tmp_path_factory.mktemp("pkg")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    proc = subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(REPO)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel, = (tmp / "dist").glob("decodescope-*.whl")
    proc = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(tmp / "site"), str(wheel)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def test_the_wheel_carries_every_kernel_source_and_both_entry_points(installed):
    wheel, = (installed / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = [p.relative_to(REPO / "csrc").as_posix() for p in (REPO / "csrc").rglob("*")
               if p.is_file() and p.suffix in (".h", ".cuh", ".cu", ".cpp")]
    assert sources and all(f"engine/csrc/{s}" in names for s in sources), sorted(set(sources) - names)
    modules = [p.relative_to(REPO).as_posix() for pkg in ("engine", "ui") for p in (REPO / pkg).rglob("*.py")]
    assert modules and not set(modules) - names, sorted(set(modules) - names)  # every subpackage is listed
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "decodescope = ui.app:main" in text and "decodescope-generate = engine.cli:main" in text


def run_installed(installed: Path, *cmd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed / "site")}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=installed)  # not the checkout


def test_the_installed_package_finds_its_kernel_sources(installed):
    code = ("from engine.ops import ext; print(ext.CSRC); "
            "print(ext.source_hash('cpu', ext.CSRC), ext.source_hash('cuda', ext.CSRC))")
    proc = run_installed(installed, sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    csrc = Path(proc.stdout.splitlines()[0])
    assert csrc == installed / "site" / "engine" / "csrc" and (csrc / "cuda" / "kernels.cu").is_file()


def test_the_installed_cli_generates(installed):
    proc = run_installed(installed, str(installed / "site" / "bin" / "decodescope-generate"), "--tiny", "-p", "hi",
                         "-n", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 tokens" in proc.stderr
