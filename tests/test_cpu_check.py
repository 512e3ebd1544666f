"""scripts/cpu_check.py: every benchmark a CPU kind needs, named for the kind, each skipped with its reason (measured
already, a flag the CPU lacks, llama.cpp's binaries missing), and no run on uncommitted code."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from bench import llamacpp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
try:
    cpu_check = importlib.import_module("cpu_check")
finally:
    sys.path.remove(str(REPO / "scripts"))

INFO = dict(cpu_model="AMD EPYC", cpu_kind="zen9", cpu_family_model="family 99 model 1", cpu_flags="avx2 fma",
            default="/m/default.gguf", gemma="/m/gemma.gguf", llamacpp_missing=None)
FILL = dict(kind="zen9", folder="/tmp/kq", gemma=INFO["gemma"], default=INFO["default"])


def step(name):
    return next(s for s in cpu_check.STEPS if s.name == name)


def test_every_step_writes_a_result_named_for_the_kind():
    for s in cpu_check.STEPS:
        cmd = cpu_check.command(s, FILL)
        assert cmd[:2] == [sys.executable, "-m"] and "--name" in cmd
        assert cmd[cmd.index("--name") + 1] == s.result.format(**FILL) and s.result.format(**FILL).endswith("-zen9")
    paired = cpu_check.command(step("paired"), FILL)
    assert paired[paired.index("--files") + 1:paired.index("--files") + 3] == ["/m/gemma.gguf", "/m/default.gguf"]


def test_skips_say_why(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_check, "RESULTS", tmp_path)
    missing = dict(INFO, llamacpp_missing="no llama-bench, llama-quantize (scripts/build_llamacpp.sh ...)")
    assert cpu_check.skip_reason(step("ports"), INFO, FILL, False) == "this CPU lacks avx512_vnni"
    assert cpu_check.skip_reason(step("paired"), missing, FILL, False) == missing["llamacpp_missing"]
    assert cpu_check.skip_reason(step("gguf-memory"), missing, FILL, False) == missing["llamacpp_missing"]
    assert cpu_check.skip_reason(step("verify"), missing, FILL, False) is None  # needs no llama.cpp
    assert cpu_check.skip_reason(step("paired"), INFO, FILL, False) is None
    (tmp_path / "verify-cpu-zen9.json").write_text("{}")
    assert cpu_check.skip_reason(step("verify"), INFO, FILL, False).startswith("measured already")
    assert cpu_check.skip_reason(step("verify"), INFO, FILL, True) is None  # --force


def test_uncommitted_code_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(cpu_check, "machine", lambda: INFO)
    monkeypatch.setattr(cpu_check, "dirty", lambda: " M engine/engine.py")
    ran = []
    monkeypatch.setattr(cpu_check.subprocess, "run", lambda *a, **k: ran.append(a))
    assert cpu_check.main(["--only", "verify", "--force"]) == 2
    assert ran == [] and "engine/engine.py" in capsys.readouterr().err


def test_a_failed_step_is_reported_and_the_run_goes_on(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cpu_check, "machine", lambda: INFO)
    monkeypatch.setattr(cpu_check, "dirty", lambda: "")
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd[2])
        return subprocess.CompletedProcess(cmd, 3 if cmd[2] == "bench.steps" else 0)

    monkeypatch.setattr(cpu_check.subprocess, "run", fake_run)
    assert cpu_check.main(["--only", "verify", "kernels", "--force", "--out", str(tmp_path)]) == 1
    assert ran == ["bench.steps", "bench.kernels", "bench.render_results"]
    out = capsys.readouterr().out
    assert "| verify | FAILED (exit 3" in out and "| kernels | ok |" in out


@pytest.mark.slow
def test_the_plan_reads_this_machine():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "cpu_check.py"), "--plan"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert "results named *-cpu-" in done.stdout and all(s.name in done.stdout for s in cpu_check.STEPS)
    assert cpu_check.machine()["llamacpp_missing"] == llamacpp.binaries_missing()  # the child's lookup is the bench's
