"""scripts/gpu_check.sh and its preflight, on a machine without a GPU: it must stop within seconds, say why,
and never reach for the network (a lent GPU machine has none, and minutes of it are all there is)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the dry run on a machine without a GPU")
def test_dry_run_stops_at_the_preflight_and_says_why(tmp_path):
    # every proxy points at a closed port: a network attempt would fail loudly instead of hanging
    env = {**os.environ, "PYTHON": sys.executable, "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "PIP_NO_INDEX": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=120)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert elapsed < 60
    summary = (tmp_path / "summary.md").read_text()
    assert "preflight | STOPPED: not ready:" in summary
    assert "CPU build" in summary or "sees no CUDA device" in summary
    facts = (tmp_path / "preflight.json").read_text()
    assert '"ready": false' in facts and not (tmp_path / "build.log").exists()


def test_preflight_names_a_bad_arch_list(monkeypatch):
    from bench import preflight

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type(
        "P", (), dict(name="Fake GPU", major=9, minor=0, multi_processor_count=132, total_memory=2**37))())
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "Hopper")
    facts, problem = preflight.check()
    assert facts["gpu"] == "Fake GPU" and "'Hopper'" in problem
