"""What every benchmark writes next to its numbers: where they came from, as JSON and a markdown table.

    with Telemetry("cuda") as tel:          # clocks, heat, power, throttling (GPU) or frequency and load (CPU)
        rows = measure()
    result["provenance"] = provenance("cuda", tel)
    write_results(out_dir, "attention-cuda", result, header + markdown_table(result["rows"], cols))
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.observe.provenance import Telemetry, snapshot

__all__ = ["Telemetry", "in_tree", "markdown_table", "provenance", "run_and_save", "write_results"]
REPO = Path(__file__).resolve().parent.parent


def _run(*cmd: str, cwd: Path = REPO) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def in_tree(tree: Path, script: str, argv: list[str], env: dict | None = None, what: str = "the run") -> dict:
    """`script` run by this Python in another source tree (first on its path: the commit before a change), and the
    JSON it prints on a line starting "RESULT "; raises with the end of its stderr when there is none."""
    env = dict(os.environ if env is None else env, PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, "-c", script, *argv], cwd=tree, env=env, capture_output=True, text=True,
                          check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{what} in {tree} failed:\n{proc.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


def tree_commit(tree: Path) -> tuple[str | None, bool | None]:
    """The commit a source tree holds and whether it has uncommitted changes (None where git cannot say). Changes
    under bench/results/ do not count: that is where the benchmarks write, and one that saves as it goes (or runs
    after another) must not call its own output a change to the code; nor does .ext-cache/, where a benchmark builds
    a baseline tree's kernels."""
    status = _run("git", "status", "--porcelain", "--", ".", ":(exclude)bench/results", ":(exclude).ext-cache",
                  cwd=tree)
    return _run("git", "rev-parse", "HEAD", cwd=tree), None if status is None else bool(status)


def provenance(device: str | torch.device, telemetry: Telemetry | None = None) -> dict:
    """Commit (and whether the tree had uncommitted changes outside bench/results/), versions, hardware,
    threads, time, and the machine's state: what `telemetry` sampled during the run, or a snapshot taken now
    (sampled=False)."""
    device = torch.device(device)
    named = os.environ.get("GPU_CHECK_COMMIT")  # a device machine's copy of the tree: its commit comes by name
    if named:
        commit, dirty = named.removesuffix("-dirty"), named.endswith("-dirty")
    else:
        commit, dirty = tree_commit(REPO)
    info = dict(
        commit=commit,
        dirty=dirty,
        time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        platform=platform.platform(),
        cpu=platform.processor() or platform.machine(),
        cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(),
        device=str(device),
    )
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            sm_count=props.multi_processor_count,
            driver=_run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        )
    info["telemetry"] = telemetry.summary() if telemetry is not None else snapshot(device)
    return info


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def markdown_table(rows: list[dict], cols: list[str]) -> str:
    """One row per dict, the given columns in order; floats to 3 significant digits, None as blank."""
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(out: str | Path, name: str, result: dict, md: str) -> tuple[Path, Path]:
    """out/name.json (the full result) and out/name.md (the table a person reads); returns both paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    md_path.write_text(md)
    return json_path, md_path


def run_and_save(out: str | Path, name: str, device: str, run, markdown) -> dict:
    """run(save) under Telemetry, where save(result) writes the result and its provenance to out/name.json and
    .md: a benchmark calls it after every row, so a run cut short keeps what it measured. Saved once more when
    the run ends (its telemetry complete), and the table printed."""
    with Telemetry(device) as tel:
        def save(result: dict) -> None:
            result["provenance"] = provenance(device, tel)
            write_results(out, name, result, markdown(result))

        result = run(save)
    save(result)
    print(markdown(result))
    return result


def alternation(n_modes: int, n_prompts: int, repeats: int) -> Iterator[tuple[int, int, int]]:
    """(repeat, prompt, mode) indices in the order to run them: each prompt under every mode back to back, the
    modes' order rotated from one prompt to the next (and one more each repeat), so every mode meets the box's
    read bandwidth within a second or two of the others (it drifts by a third within minutes) and none is always
    first after another's run; the prompts keep their order within a repeat."""
    for rep in range(repeats):
        for i in range(n_prompts):
            turn = (rep + i) % n_modes
            for m in [*range(turn, n_modes), *range(turn)]:
                yield rep, i, m
