"""The one run a lent GPU machine gets; scripts/gpu_check.sh calls it. Python's standard library only, so it runs,
and says why it stops, on a machine whose torch is broken or CPU-only.

    python3 scripts/gpu_check.py OUT_DIR     # exit 2: stopped at the preflight; 1: a step failed, timed out or was
                                             # skipped; 0: every step ran and passed
    python3 scripts/gpu_check.py --plan      # the steps, their time caps and what each saves

The steps run in order of value, each in its own process under its own time cap, the caps adding up to less
than the budget (GPU_CHECK_BUDGET_S, default 540 s: the device call's 10 minutes less a margin): a preflight that
stops the run without a usable GPU, the kernels built from a clean cache, the kernel and GEMV tests, the headline
figures, then the graph and speculative tests and the wider benchmarks. No step needs the network or a model
download: the benchmarks run random weights of the default model's and TinyLlama's shapes, the tests tiny models.
The kernels build for GPU_CHECK_ARCH (default 9.0, an H200) whatever TORCH_CUDA_ARCH_LIST the machine presets.

A device call hands back at most 8 files, two folders deep, so OUT_DIR holds four at most, rewritten after every
step: gpu_check.tar.gz (every log, the tests' records and junit XML, the benchmarks' JSON and markdown, the
preflight's facts), summary.md and summary.json (each step, the tests, the goals against their targets), and
running.log, the live log of the step under way (inside the tarball once it ends).

GPU_CHECK_DESELECT: pytest node ids (space-separated) the test steps leave out, so a rerun gets past a test that
kills its process (a segfault ends the rest of its group) and the summary's commands name what was left out.
GPU_CHECK_ONLY: the steps to run (space-separated names; the preflight always runs), for a rerun of what a fix
touched in the device time left; the others are reported skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_summary  # noqa: E402  (beside this file)

REPO = Path(__file__).resolve().parent.parent
BUDGET_S = 540  # nine minutes: the device call's limit is ten
PACK_RESERVE_S = 10  # kept back from the last step for the final summary and tarball
MIN_STEP_S = 10  # a step with less time than this left is skipped
DEFAULT_ARCH = "9.0"


@dataclass(frozen=True)
class Step:
    name: str
    cap_s: int
    saves: str
    argv: tuple[str, ...]  # "{py}" and "{work}" are filled in
    stops_run: bool = False  # a failure ends the run (the preflight)
    env_if_failed: tuple[tuple[str, str], ...] = ()  # set for the steps after this one when it fails
    plugins: bool = False  # loads scripts/pytest_deadline.py (scripts/ goes on PYTHONPATH)


def tests(name: str, cap_s: int, deadline_s: int, saves: str, *selection: str) -> Step:
    """A pytest process: verbose, one JSON record per test as it runs, a per-test deadline."""
    return Step(name, cap_s, saves, ("{py}", "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider", "-p",
                                     "pytest_deadline", f"--deadline={deadline_s}",
                                     f"--records={{work}}/tests/{name}.jsonl", f"--junitxml={{work}}/tests/{name}.xml",
                                     *selection), plugins=True)


STEPS = (
    Step("preflight", 20, "preflight.json: torch, CUDA, the GPU, nvcc, ninja, a host C++ compiler, Python.h, the "
         "arch list; stops a run that cannot build or test",
         ("{py}", "-m", "bench.preflight", "{work}/preflight.json"), stops_run=True),
    # without kernels, later steps would each start the build again: they run the twins instead, and say so
    Step("build", 150, "logs/build.log: the CUDA kernels built from a clean cache, nvcc's output and time",
         ("{py}", "-m", "engine.ops.ext", "build", "--target", "cuda", "--verbose"),
         env_if_failed=(("DECODESCOPE_NO_EXT", "1"),)),
    tests("test_kernels", 45, 30, "tests/test_kernels.*: norms, rope, silu, decode attention against their twins",
          "tests/test_kernels_cuda.py", "-m", "not emulation", "-k", "not emulated and not clean_cache"),
    tests("test_gemv", 55, 30, "tests/test_gemv.*: int8/q4 at every row count, the dequantize route, q4 and int8 "
          "models against their twins; a position's logits the same bits in a decode step and a verify pass of "
          "any T", "tests/test_gemv_cuda.py", "tests/test_batch_invariance.py", "-m", "not emulation", "-k",
          "not emulated and cuda"),
    Step("goals", 60, "goals/latency-cuda.*: fused bf16 decode, eager and graphed, TinyLlama and default shapes",
         ("{py}", "-m", "bench.latency", "--device", "cuda", "--shapes", "tinyllama", "default", "--formats", "bf16",
          "--kernels", "fused", "--batch", "1", "--new-tokens", "64", "--out", "{work}/goals")),
    Step("bench_gemv", 30, "bench/gemv-cuda.*: q4, int8 and bf16 products alone at T = 1, 6, 16, 17, 64",
         ("{py}", "-m", "bench.gemv", "--out", "{work}/bench")),
    Step("bench_attention", 30, "bench/attention-cuda.*: decode attention at 4k and 32k against SDPA",
         ("{py}", "-m", "bench.attention", "--contexts", "4096", "32768", "--iters", "30", "--out", "{work}/bench")),
    tests("test_graphs", 70, 60, "tests/test_graphs.*: graphs, graphed speculation on the fused kernels, bf16",
          "tests/test_graphs.py", "tests/test_drafters.py", "tests/test_speculative.py", "-m", "cuda"),
    Step("bench_latency", 40, "bench/latency-cuda.*: int8 and q4 decode at batch 1 and 8, eager and graphed",
         ("{py}", "-m", "bench.latency", "--device", "cuda", "--formats", "int8", "q4", "--kernels", "fused",
          "--batch", "1", "8", "--new-tokens", "64", "--out", "{work}/bench")),
    Step("bench_profile", 30, "bench/profile-cuda.*: a decode step by layer and op class, eager/graph x torch/fused",
         ("{py}", "-m", "bench.profile", "--device", "cuda", "--steps", "6", "--out", "{work}/bench")),
)


def plan(budget_s: int) -> str:
    rows = [f"{s.name:<16} {s.cap_s:>4} s  {s.saves}" for s in STEPS]
    total = sum(s.cap_s for s in STEPS)
    return "\n".join([f"{'step':<16} {'cap':>6}  saves", *rows,
                      f"caps add up to {total} s of a {budget_s} s budget ({PACK_RESERVE_S} s kept for the summary); "
                      "each step's limit is its cap or what is left, whichever is less"]) + "\n"


def run_step(argv: list[str], env: dict, log_path: Path, limit_s: float) -> tuple[int | None, bool]:
    """(exit status, timed out): the process group is ended at the limit. Output goes to the log and to stdout."""
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", bufsize=1, start_new_session=True)

        def pump():
            for line in proc.stdout:
                log.write(line)
                log.flush()
                sys.stdout.write(line)
                sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            return proc.wait(timeout=limit_s), False
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=5)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            return proc.returncode, True
        finally:
            reader.join(timeout=5)


def pack(work: Path, out: Path) -> None:
    """work/ as OUT/gpu_check.tar.gz, replaced in one rename so a run cut short leaves a whole one."""
    partial = out / "gpu_check.tar.gz.partial"
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(work, arcname="gpu_check")
    os.replace(partial, out / "gpu_check.tar.gz")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="where the tarball and the summary go")
    p.add_argument("--plan", action="store_true", help="print the steps, their caps and what each saves")
    args = p.parse_args(argv)
    budget = int(os.environ.get("GPU_CHECK_BUDGET_S", BUDGET_S))
    if args.plan:
        print(plan(budget), end="")
        return 0
    if not args.out:
        p.error("give OUT_DIR (or --plan)")
    start = time.monotonic()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    (work / "logs").mkdir()
    (work / "tests").mkdir()
    ext_cache = Path(tempfile.mkdtemp(prefix="decodescope-ext-"))  # a clean build, kept out of the tarball
    arch = os.environ.get("GPU_CHECK_ARCH", DEFAULT_ARCH)
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": arch, "GPU_CHECK_PRESET_ARCH_LIST": os.environ.get(
        "TORCH_CUDA_ARCH_LIST", ""), "DECODESCOPE_EXT_CACHE": str(ext_cache), "DECODESCOPE_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PIP_NO_INDEX": "1", "PYTHONUNBUFFERED": "1"}
    run = gpu_summary.Run(budget_s=budget, arch=arch, preset_arch=os.environ.get("TORCH_CUDA_ARCH_LIST"),
                          python=sys.executable, commit=os.environ.get("GPU_CHECK_COMMIT") or git_commit())
    stopped = False
    only = os.environ.get("GPU_CHECK_ONLY", "").split()
    deselect = [arg for node in os.environ.get("GPU_CHECK_DESELECT", "").split() for arg in ("--deselect", node)]
    for step in STEPS:
        left = budget - PACK_RESERVE_S - (time.monotonic() - start)
        if only and step.name not in only and not step.stops_run:
            run.add(step.name, "SKIPPED: not in GPU_CHECK_ONLY", 0, step.cap_s)
            continue
        if stopped:
            run.add(step.name, "not run: the preflight stopped the run", 0, step.cap_s)
            continue
        if left < MIN_STEP_S:
            run.add(step.name, "SKIPPED: the time budget is spent", 0, step.cap_s)
            continue
        limit = min(step.cap_s, left)
        print(f"=== {step.name} (limit {limit:.0f} s): {step.saves}", flush=True)
        cmd = [a.replace("{py}", sys.executable).replace("{work}", str(work)) for a in step.argv]
        live = out / "running.log"
        step_env = env
        if step.plugins:
            cmd += deselect
            step_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "scripts"),
                                                                           env.get("PYTHONPATH")]))}
        t0 = time.monotonic()
        rc, timed_out = run_step(cmd, step_env, live, limit)
        shutil.move(live, work / "logs" / f"{step.name}.log")
        status = ("ok" if rc == 0 else f"TIMEOUT after {limit:.0f} s" if timed_out else f"FAILED (exit {rc})")
        if step.stops_run and rc != 0:
            status, stopped = f"STOPPED: {last_line(work / 'logs' / f'{step.name}.log')}", True
        if rc != 0 and step.env_if_failed:
            env.update(step.env_if_failed)
            status += "; the steps after it run with " + " ".join(f"{k}={v}" for k, v in step.env_if_failed)
        run.add(step.name, status, time.monotonic() - t0, step.cap_s, limit, cmd)
        save(run, work, out, start)
    save(run, work, out, start)
    print((out / "summary.md").read_text(), flush=True)
    shutil.rmtree(ext_cache, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    return 2 if stopped else (0 if run.all_ok() else 1)


def save(run: gpu_summary.Run, work: Path, out: Path, start: float) -> None:
    run.total_s = time.monotonic() - start
    run.collect(work)
    (work / "summary.json").write_text(json.dumps(run.as_json(), indent=2) + "\n")
    (out / "summary.json").write_text(json.dumps(run.as_json(), indent=2) + "\n")
    (out / "summary.md").write_text(run.markdown())
    pack(work, out)


def last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def git_commit() -> str | None:
    try:
        proc = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


if __name__ == "__main__":
    sys.exit(main())
