"""The CPU benchmarks each CPU kind needs in bench/results, in one run: what a session on a new kind of CPU (a Zen 5, a
Xeon) runs to fill in its tables, each result named for the kind (`...-cpu-<kind>`, provenance's cpu_kind).

    python scripts/cpu_check.py            # every step whose result this kind does not have yet, then RESULTS.md
    python scripts/cpu_check.py --plan     # the kind, and each step's command, rough minutes and result file
    python scripts/cpu_check.py --only verify spec --force    # these steps, measured again

Each step is one benchmark in its own process, its output in OUT/<step>.log; a step that fails is reported and the
run goes on. The tree must be committed first (a result's provenance names the commit; bench/results aside), and
nothing else should run meanwhile: the steps time the memory and the cores. The llama.cpp steps need
scripts/build_llamacpp.sh's binaries (found as bench/llamacpp.py finds them) and are skipped, with the reason,
without them. This orchestrator imports neither torch nor engine (engine sets an OpenMP default its children would
inherit); the kind and the binaries come from a child.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


@dataclass(frozen=True)
class Step:
    name: str
    result: str  # the results' file name, {kind} filled in
    minutes: int  # rough, on 2 cores
    argv: tuple[str, ...]  # after `python -m`; {kind}, {folder}, {gemma} and {default} filled in
    llamacpp: bool = False  # needs llama-server and llama-bench
    needs: str = ""  # a CPU flag the step measures (the ports need VNNI)


STEPS = (
    Step("ports", "ports-cpu-{kind}", 1, ("bench.ports", "--name", "ports-cpu-{kind}"), needs="avx512_vnni"),
    Step("verify", "verify-cpu-{kind}", 4, ("bench.steps", "--formats", "q4", "q4_a8", "int8", "fp32",
                                            "--name", "verify-cpu-{kind}")),
    Step("kernels", "kernels-formats-cpu-{kind}", 4,
         ("bench.kernels", "--alternate", "q4", "q4_a8", "q4_k", "q5_k", "q6_k", "q4_0", "q5_0", "q5_1", "int8",
          "--rows", "1", "6", "--repeats", "15", "--name", "kernels-formats-cpu-{kind}")),
    Step("step-after", "step-after-cpu-{kind}", 3, ("bench.step_after", "--then", "6", "--name",
                                                    "step-after-cpu-{kind}")),
    Step("overlap", "overlap-cpu-{kind}", 1, ("bench.overlap", "--name", "overlap-cpu-{kind}")),
    Step("tile-pace", "tile-pace-cpu-{kind}", 5, ("bench.tile_pace", "--name", "tile-pace-cpu-{kind}"),
         needs="avx512_vnni"),
    Step("vcpus", "vcpus-cpu-{kind}", 3, ("bench.vcpus", "--rounds", "30", "--pause", "4", "--name",
                                          "vcpus-cpu-{kind}"), needs="avx512_vnni"),
    Step("verify-pace", "verify-pace-cpu-{kind}", 2, ("bench.verify_pace", "--samples", "200", "--name",
                                                       "verify-pace-cpu-{kind}"), needs="avx512_vnni"),
    Step("spec", "spec-cpu-q4-q4_a8-{kind}", 8, ("bench.spec", "--targets", "q4", "q4_a8",
                                                 "--name", "spec-cpu-q4-q4_a8-{kind}")),
    Step("spec-fp32", "spec-cpu-fp32-edit-{kind}", 4, ("bench.spec", "--targets", "fp32", "--sets", "edit",
                                                       "--name", "spec-cpu-fp32-edit-{kind}")),
    Step("spec-open", "spec-open-cpu-{kind}", 5, ("bench.spec_open", "--repeats", "5",
                                                  "--name", "spec-open-cpu-{kind}")),
    Step("spec-kquant", "spec-kquant-cpu-{kind}", 3, ("bench.spec_kquant", "--name", "spec-kquant-cpu-{kind}")),
    Step("paired", "paired-decode-cpu-{kind}", 6,
         ("bench.paired_decode", "--shapes", "1.5B", "3B", "--files", "{gemma}", "{default}", "--folder", "{folder}",
          "--name", "paired-decode-cpu-{kind}"), llamacpp=True),
    Step("gguf-memory", "gguf-memory-cpu-{kind}", 5,
         ("bench.gguf_memory", "--shapes", "1.5B", "3B", "--files", "{gemma}", "{default}", "--folder", "{folder}",
          "--repeats", "7", "--name", "gguf-memory-cpu-{kind}"), llamacpp=True),
)

PROBE = """
import json
from bench import llamacpp
from engine.checkpoint import default_model, embedded
from engine.observe.provenance import cpu_info
quiet = lambda msg: None
print(json.dumps(dict(cpu_info(), default=str(default_model.gguf_path(progress=quiet)),
                      gemma=str(embedded.gguf_path(embedded.GEMMA3_270M, progress=quiet)),
                      llamacpp_missing=llamacpp.binaries_missing())))
"""


def machine() -> dict:
    """cpu_info() (the kind, the flags), the embedded models' GGUF files and which llama.cpp binaries are missing
    (bench.llamacpp.binaries_missing), from a child process."""
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"could not read the CPU's kind: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def dirty() -> str:
    """The uncommitted changes outside bench/results/ (what a result's provenance would call dirty)."""
    done = subprocess.run(["git", "status", "--porcelain", "--", ".", ":(exclude)bench/results"], cwd=REPO,
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def command(step: Step, fill: dict) -> list[str]:
    return [sys.executable, "-m", *(a.format(**fill) for a in step.argv)]


def skip_reason(step: Step, info: dict, fill: dict, force: bool) -> str | None:
    if step.needs and step.needs not in info["cpu_flags"].split():
        return f"this CPU lacks {step.needs}"
    if step.llamacpp and info["llamacpp_missing"]:
        return info["llamacpp_missing"]
    if not force and (RESULTS / f"{step.result.format(**fill)}.json").exists():
        return "measured already (--force measures again)"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="the CPU benchmarks a CPU kind needs, named for it")
    p.add_argument("--plan", action="store_true", help="say what would run, and run nothing")
    p.add_argument("--only", nargs="+", choices=[s.name for s in STEPS], help="these steps only")
    p.add_argument("--force", action="store_true", help="measure steps whose result exists")
    p.add_argument("--kind", help="the name in the results' files (default: provenance's cpu_kind)")
    p.add_argument("--folder", default="/tmp/decodescope-kquant", help="where the random K-quant files are made")
    p.add_argument("--out", default=None, help="the steps' logs (default /tmp/cpu-check-<kind>)")
    p.add_argument("--allow-dirty", action="store_true", help="run on uncommitted changes (results say dirty=True)")
    args = p.parse_args(argv)

    info = machine()
    fill = dict(kind=args.kind or info["cpu_kind"], folder=args.folder, gemma=info["gemma"], default=info["default"])
    steps = [s for s in STEPS if not args.only or s.name in args.only]
    print(f"CPU: {info['cpu_model']}, {info['cpu_kind']} ({info['cpu_family_model']}), flags {info['cpu_flags']}; "
          f"results named *-cpu-{fill['kind']}")
    plan = [(s, skip_reason(s, info, fill, args.force)) for s in steps]
    for s, why in plan:
        print(f"  {s.name:12s} ~{s.minutes:2d} min  {s.result.format(**fill)}  " +
              (f"skip: {why}" if why else " ".join(command(s, fill)[1:])))
    if args.plan:
        return 0
    if (changes := dirty()) and not args.allow_dirty:
        print(f"the tree has uncommitted changes (commit them first, or --allow-dirty):\n{changes}", file=sys.stderr)
        return 2
    out = Path(args.out or f"/tmp/cpu-check-{fill['kind']}")
    out.mkdir(parents=True, exist_ok=True)
    report, failed = [], 0
    for s, why in plan:
        if why:
            report.append((s.name, f"skipped: {why}", 0.0))
            continue
        log = out / f"{s.name}.log"
        start = time.monotonic()
        with log.open("w") as f:
            done = subprocess.run(command(s, fill), cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=False)
        minutes = (time.monotonic() - start) / 60
        status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode}; {log})"
        failed += done.returncode != 0
        report.append((s.name, status, minutes))
        print(f"{s.name}: {status}, {minutes:.1f} min", flush=True)
    subprocess.run([sys.executable, "-m", "bench.render_results"], cwd=REPO, check=False)
    print("\n| step | status | minutes |\n|---|---|---|")
    for name, status, minutes in report:
        print(f"| {name} | {status} | {minutes:.1f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
