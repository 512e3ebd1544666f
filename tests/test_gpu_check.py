"""scripts/gpu_check.sh and what it runs, on a machine without a GPU: the dry run stops within seconds, says why and
leaves its summary, never reaching for the network; the plan fits the budget and the device call's limits; the
tests it selects need no model download; its per-test deadline ends a hung test; the summary reads the goals
from the benchmarks' JSON; the preflight names what stops a run; the GEMV benchmark's sweep runs every route."""
from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.sh"
MAX_FILES, MAX_DEPTH = 8, 2  # what a device call hands back from $OUT: 8 files, 2 folders down
NAME = re.compile(r"[A-Za-z0-9._-]+")


def load(name: str):
    """A module of scripts/ (not a package): imported by name with that folder on the path."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "scripts"))


gpu_check, gpu_summary = load("gpu_check"), load("gpu_summary")


def offline_env(**extra) -> dict:
    # every proxy points at a closed port: a network attempt would fail loudly instead of hanging
    return {**os.environ, "PYTHON": sys.executable, "http_proxy": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9", "PIP_NO_INDEX": "1", **extra}


def returned_files(out: Path) -> list[Path]:
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, files
    for p in files:
        rel = p.relative_to(out)
        assert len(rel.parts) - 1 <= MAX_DEPTH and all(NAME.fullmatch(part) for part in rel.parts), rel
    return files


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the dry run on a machine without a GPU")
def test_dry_run_stops_at_the_preflight_and_says_why(tmp_path):
    t0 = time.perf_counter()
    # .git does not travel to the device: the commit comes in by name (README's GPU notes)
    proc = subprocess.run(["bash", str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                          env=offline_env(GPU_CHECK_COMMIT="0123abcd"), timeout=120)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert elapsed < 60
    files = returned_files(tmp_path)
    assert sorted(p.name for p in files) == ["gpu_check.tar.gz", "summary.json", "summary.md"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| preflight | STOPPED: not ready:" in summary and "commit 0123abcd;" in summary
    assert "CPU build" in summary or "sees no CUDA device" in summary
    assert all(f"| {s.name} | not run: the preflight stopped the run |" in summary for s in gpu_check.STEPS[1:])
    facts = json.loads((tmp_path / "summary.json").read_text())
    assert facts["steps"][0]["status"].startswith("STOPPED") and facts["arch"] == "9.0"
    assert facts["commit"] == "0123abcd"
    assert [g["met"] for g in facts["goals"]] == [None] * 6
    with tarfile.open(tmp_path / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
        preflight = json.load(tar.extractfile("gpu_check/preflight.json"))
    assert "gpu_check/logs/preflight.log" in names and not any("build" in n for n in names)
    assert preflight["ready"] is False and preflight["arch_list_env"] == "9.0"


def test_a_run_saves_every_step_and_keeps_to_its_budget(tmp_path, monkeypatch):
    """The runner with stand-in steps: a failed build switches the kernels off for the steps after it, a step
    that would outlast the budget is ended at it (its process group too), the next is skipped, and OUT holds
    the summary and the tarball only, with each step's log inside."""
    py = sys.executable
    monkeypatch.setattr(gpu_check, "STEPS", (
        gpu_check.Step("preflight", 5, "-", (py, "-c", "print('ready')"), stops_run=True),
        gpu_check.Step("build", 5, "-", (py, "-c", "import sys; print('nvcc: error'); sys.exit(3)"),
                       env_if_failed=(("DECODESCOPE_NO_EXT", "1"),)),
        gpu_check.Step("after_build", 5, "-", (py, "-c", "import os, sys; sys.exit(os.environ['DECODESCOPE_NO_EXT'] "
                                                          "!= '1' or os.environ['TORCH_CUDA_ARCH_LIST'] != '8.9')")),
        gpu_check.Step("hog", 100, "-", ("bash", "-c", "sleep 100 & wait")),
        gpu_check.Step("late", 5, "-", (py, "-c", "print('never')")),
    ))
    monkeypatch.setattr(gpu_check, "PACK_RESERVE_S", 0)
    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 1)
    monkeypatch.setenv("GPU_CHECK_BUDGET_S", "8")
    monkeypatch.setenv("GPU_CHECK_ARCH", "8.9")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "Hopper")  # what a machine may preset: overridden, and recorded
    t0 = time.perf_counter()
    assert gpu_check.main([str(tmp_path)]) == 1
    assert time.perf_counter() - t0 < 20
    facts = json.loads((tmp_path / "summary.json").read_text())
    status = {s["name"]: s["status"] for s in facts["steps"]}
    assert status["preflight"] == "ok" and status["after_build"] == "ok"
    assert status["build"] == "FAILED (exit 3); the steps after it run with DECODESCOPE_NO_EXT=1"
    assert status["hog"].startswith("TIMEOUT after") and status["late"] == "SKIPPED: the time budget is spent"
    assert facts["arch"] == "8.9" and facts["preset_arch"] == "Hopper"
    assert sorted(p.name for p in returned_files(tmp_path)) == ["gpu_check.tar.gz", "summary.json", "summary.md"]
    with tarfile.open(tmp_path / "gpu_check.tar.gz") as tar:
        build_log = tar.extractfile("gpu_check/logs/build.log").read().decode()
        assert {f"gpu_check/logs/{n}.log" for n in ("preflight", "after_build", "hog")} <= set(tar.getnames())
    assert "nvcc: error" in build_log


def test_a_rerun_leaves_out_the_tests_named(tmp_path, monkeypatch):
    """GPU_CHECK_DESELECT reaches every test step's pytest (and the summary's command), no other step."""
    py = sys.executable
    (tmp_path / "test_two.py").write_text("def test_crashes():\n    import os; os.abort()\n\n"
                                          "def test_runs():\n    pass\n")
    out = tmp_path / "out"
    monkeypatch.setattr(gpu_check, "STEPS", (
        gpu_check.tests("tests_a", 30, 20, "-", str(tmp_path / "test_two.py")),
        gpu_check.Step("bench", 5, "-", (py, "-c", "import sys; sys.exit(len(sys.argv) != 1)")),
    ))
    # the node id as pytest names it from the repository, where the step runs (the file lies outside it)
    listed = subprocess.run([py, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             str(tmp_path / "test_two.py")], cwd=gpu_check.REPO, capture_output=True, text=True)
    node = next(line for line in listed.stdout.splitlines() if line.endswith("::test_crashes"))
    monkeypatch.setenv("GPU_CHECK_DESELECT", node)
    assert gpu_check.main([str(out)]) == 0
    facts = json.loads((out / "summary.json").read_text())
    steps = {s["name"]: s for s in facts["steps"]}
    assert steps["tests_a"]["status"] == "ok" and steps["bench"]["status"] == "ok"
    assert "--deselect" in steps["tests_a"]["command"] and "--deselect" not in steps["bench"]["command"]
    assert facts["tests"]["tests_a"]["passed"] == 1 and facts["tests"]["tests_a"]["failed"] == 0


def test_a_rerun_runs_only_the_steps_named(tmp_path, monkeypatch):
    """GPU_CHECK_ONLY: the preflight and the steps named run, the rest are reported skipped (exit 1: not all ran)."""
    py = sys.executable
    monkeypatch.setattr(gpu_check, "STEPS", tuple(
        gpu_check.Step(name, 5, "-", (py, "-c", f"print('{name} ran')"), stops_run=name == "preflight")
        for name in ("preflight", "build", "bench", "tests")))
    monkeypatch.setenv("GPU_CHECK_ONLY", "build tests")
    assert gpu_check.main([str(tmp_path)]) == 1
    status = {s["name"]: s["status"] for s in json.loads((tmp_path / "summary.json").read_text())["steps"]}
    assert status == {"preflight": "ok", "build": "ok", "bench": "SKIPPED: not in GPU_CHECK_ONLY", "tests": "ok"}


def test_plan_lists_every_step_within_the_budget():
    proc = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True, env=offline_env(),
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    for step in gpu_check.STEPS:
        assert re.search(rf"^{step.name}\s+{step.cap_s} s\s+\S", proc.stdout, re.M), step.name
    total = sum(s.cap_s for s in gpu_check.STEPS)
    assert total + gpu_check.PACK_RESERVE_S <= gpu_check.BUDGET_S <= 540  # nine minutes, in a ten-minute call
    assert f"caps add up to {total} s of a {gpu_check.BUDGET_S} s budget" in proc.stdout
    names = [s.name for s in gpu_check.STEPS]
    assert names[:2] == ["preflight", "build"] and gpu_check.STEPS[0].stops_run
    # the kernels' tests, then the headline figures, before the slower graph tests and the wider benchmarks
    order = [names.index(n) for n in ("test_kernels", "goals", "test_graphs", "bench_profile")]
    assert order == sorted(order)
    assert sum(1 for s in gpu_check.STEPS if "pytest" in s.argv) == 3


def selection(step) -> list[str]:
    """A pytest step's arguments after the plugin's: the files and the -m / -k filters."""
    argv = list(step.argv)
    return argv[argv.index("--junitxml={work}/tests/" + step.name + ".xml") + 1:]


PLUGIN = '''
import json, os
def pytest_collection_finish(session):
    with open(os.environ["COLLECTED_JSON"], "w") as f:
        json.dump([(i.nodeid, i.fixturenames) for i in session.items], f)
'''


@pytest.mark.parametrize("name", ["test_kernels", "test_gemv", "test_graphs"])
def test_test_steps_need_no_model_download(tmp_path, name):
    """The GPU machine has no network and no model cache: no selected test may use the default model."""
    step = next(s for s in gpu_check.STEPS if s.name == name)
    (tmp_path / "collect_plugin.py").write_text(PLUGIN)
    env = offline_env(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}", COLLECTED_JSON=str(tmp_path / "collected.json"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "collect_plugin",
                           "-p", "no:cacheprovider", *selection(step)], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    items = json.loads((tmp_path / "collected.json").read_text())
    assert items, "the step selects no test"
    assert not [nodeid for nodeid, fixtures in items if "default_model_dir" in fixtures]
    assert not [nodeid for nodeid, _ in items if "emulated" in nodeid]  # CI runs those
    invariance = [nodeid for nodeid, _ in items if nodeid.startswith("tests/test_batch_invariance.py")]
    if name == "test_gemv":  # its CUDA cases only: the CPU ones would build the CPU kernels on the device's time
        assert invariance and all("::test_cuda_" in nodeid for nodeid in invariance), invariance


def test_no_virtual_environment_travels_with_the_tree():
    """The tree goes to a device machine as it is (64 MiB at most): a venv under any usual name stays behind."""
    names = [".venv/x", ".v/x", ".venv-gpu/x", "venv/x", "venv311/x"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=REPO, capture_output=True, text=True)
    assert proc.stdout.split() == names, proc.stdout + proc.stderr


def test_a_hung_test_ends_its_process_at_the_deadline(tmp_path):
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_quick():\n    pass\n\n"
                                           "def test_hangs():\n    time.sleep(60)\n\ndef test_never_reached():\n"
                                           "    pass\n")
    records = tmp_path / "records.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "pytest_deadline",
                           "--deadline=2", f"--records={records}", str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=offline_env(PYTHONPATH=str(REPO / "scripts")))
    assert time.perf_counter() - t0 < 30 and proc.returncode != 0
    stacks = records.read_text()
    assert "Timeout" in stacks and "in test_hangs" in stacks  # faulthandler's dump names where it hung
    assert "test_never_reached" not in stacks
    counts = gpu_summary.test_counts(records)
    assert counts["passed"] == 1 and counts["failed"] == 0
    assert "running when the process ended: test_hangs" in counts["note"]


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_summary_reads_the_goals_from_the_results(tmp_path):
    work = tmp_path
    write(work / "preflight.json", dict(gpu="NVIDIA H200", capability="9.0", torch="2.11.0", torch_cuda="13.0"))
    (work / "tests").mkdir()
    for name in ("test_kernels", "test_gemv", "test_graphs"):
        (work / "tests" / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in [
            dict(event="start", nodeid=f"tests/x.py::{name}_a"),
            dict(event="report", nodeid=f"tests/x.py::{name}_a", when="call", outcome="passed", seconds=0.1),
            dict(event="report", nodeid=f"tests/x.py::{name}_a", when="teardown", outcome="passed", seconds=0)]))
    invariance = [dict(event="report", nodeid=f"tests/test_batch_invariance.py::{gpu_summary.INVARIANCE_TEST}"
                                              f"[cuda-{case}]", when="call", outcome="passed") for case in
                  ("int8-bf16", "q4-fp32")]
    with open(work / "tests" / "test_gemv.jsonl", "a") as f:
        f.write("\n" + "\n".join(json.dumps(r) for r in invariance))
    row = dict(weights="bf16", kernels="fused", batch=1)
    write(work / "goals" / "latency-cuda.json", dict(bandwidth_gbs=4300.0, rows=[
        dict(row, shape="tinyllama", graph=True, ms_per_step=0.65, gb_s=2.21e9 / 0.65 / 1e6),
        dict(row, shape="default", graph=False, ms_per_step=3.0, gb_s=1.0),
        dict(row, shape="default", graph=True, ms_per_step=0.75, gb_s=4.0)]))
    write(work / "bench" / "gemv-cuda.json", dict(copy_bandwidth_gb_s=4300.0, rows=[
        dict(weights="q4", tokens=1, gb_s=3500.0), dict(weights="q4", tokens=6, gb_s=100.0)]))
    write(work / "bench" / "attention-cuda.json", dict(copy_bandwidth_gb_s=4300.0, rows=[
        dict(shape="32x8x128", context=32768, window=0, impl="decodescope", gb_s=3400.0),
        dict(shape="9x3x64", context=32768, window=0, impl="decodescope", gb_s=2900.0),
        dict(shape="9x3x64", context=32768, window=0, impl="sdpa", gb_s=4000.0)]))
    run = gpu_summary.Run(budget_s=540, arch="9.0", preset_arch=None, python="python3", commit="abc")
    for name in ("test_kernels", "test_gemv", "test_graphs"):
        run.add(name, "ok", 10, 45)
    run.collect(work)
    goals = {g.goal.split(" ")[0] + g.unit: g for g in run.goals}
    assert goals["every%"].met and goals["every%"].value == 100
    step = goals["fused%"]
    assert step.value == pytest.approx(100 * 3400 / 4800) and step.met is True  # 2.21 GB in 0.65 ms of 4.8 TB/s
    assert "79% of the 4300 GB/s copy bandwidth" in step.detail
    assert goals["graphx"].value == pytest.approx(4.0) and goals["graphx"].met
    assert goals["q4%"].value == pytest.approx(100 * 3500 / 4800) and goals["q4%"].met
    attn = goals["decode%"]
    assert attn.value == pytest.approx(100 * 2900 / 4800) and attn.met is False  # the weaker shape decides
    md = run.markdown()
    assert "| decode attention at 32k >= 65% of HBM bandwidth (every shape) | 60.4% | 65% | NO |" in md
    assert "# GPU check: NVIDIA H200 (9.0)" in md
    assert goals["speculative%"].met and goals["speculative%"].detail == "2 of 2 cases"
    assert "| speculative = plain: a decode step's logits and a verify pass's" in md
    run.steps[-1].status = "TIMEOUT after 70 s"
    invariance[1]["outcome"] = "failed"
    (work / "tests" / "test_gemv.jsonl").write_text("\n".join(json.dumps(r) for r in invariance))
    run.collect(work)
    assert run.goals[0].met is False and "test_graphs: TIMEOUT after 70 s" in run.goals[0].detail
    assert run.goals[1].value == 50 and run.goals[1].met is False and "not: cuda-q4-fp32" in run.goals[1].detail


def fake_device(monkeypatch, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type(
        "P", (), dict(name="Fake GPU", major=capability[0], minor=capability[1], multi_processor_count=132,
                      total_memory=2**37))())


def test_preflight_names_a_bad_arch_list(monkeypatch):
    from bench import preflight

    fake_device(monkeypatch, (9, 0))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "Hopper")
    facts, problem = preflight.check()
    assert facts["gpu"] == "Fake GPU" and "'Hopper'" in problem


def test_preflight_stops_a_build_without_a_compiler_or_python_headers(monkeypatch, tmp_path):
    """Either one missing fails the build, and every later step would then run the twins: stop at the preflight."""
    from bench import preflight

    fake_device(monkeypatch, (9, 0))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    facts, problem = preflight.check()
    assert facts["python_h"] and facts["python_h"].endswith("Python.h")  # this machine builds the CPU kernels
    monkeypatch.setenv("CXX", "no-such-c++")
    monkeypatch.setattr(preflight.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    facts, problem = preflight.check()
    assert facts["cxx"] is None and facts["python_h"] is None
    assert "a host C++ compiler ('no-such-c++' is not on PATH" in problem
    assert f"Python.h (not in {tmp_path}; install python3-dev" in problem


def test_preflight_stops_a_build_the_device_cannot_run(monkeypatch):
    from bench import preflight

    fake_device(monkeypatch, (8, 0))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    _, problem = preflight.check()
    assert "cannot run on this 8.0 device" in problem and "GPU_CHECK_ARCH" in problem
    assert preflight.covers(["9.0"], (9, 0)) and preflight.covers(["8.0+PTX"], (9, 0))
    assert not preflight.covers(["9.0"], (8, 0)) and not preflight.covers(["8.0"], (9, 0))


@pytest.mark.emulation
def test_gemv_benchmark_sweeps_every_route():
    """bench/gemv.py's sweep on the CPU emulation of the kernels: the GEMV rows and the dequantize route, each
    product against its twin, and the byte count a GB/s figure divides."""
    from cuda_backends import EmulatedModule

    from bench import gemv
    from engine import ops, weights
    from engine.ops import ref

    products = ops.cuda_ops(EmulatedModule(), "emulated").linear
    shapes = [(40, 64), (24, 96)]
    g = torch.Generator().manual_seed(0)
    for fmt in ("q4", "int8", "bf16"):
        ws = gemv.random_weights(fmt, shapes, 2, g, device="cpu")
        assert [(w.out_features, w.in_features) for w in ws] == shapes * 2
        assert sum(w.nbytes for w in ws) == 2 * sum(weights.get(fmt).nbytes(o, i) for o, i in shapes)
        for T in (1, 17):
            xs = {i: torch.randn(T, i, generator=g, dtype=torch.bfloat16) for _, i in shapes}
            for w, y in zip(ws, gemv.sweep(products, ws, xs), strict=True):
                want = ref.linear(xs[w.in_features], weights.dequantize(weights.unpack(w)))
                torch.testing.assert_close(y.float(), want.float(), rtol=0.02, atol=0.02)
    assert gemv.layer_shapes("tinyllama") == [(2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632)]
