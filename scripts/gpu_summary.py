"""What a GPU check run (scripts/gpu_check.py) reports: each step's status, the tests' counts from their records,
and the goals of the first GPU run read from the benchmarks' JSON, as summary.md and summary.json. Standard
library only; a figure a step did not produce is reported as not measured, never guessed.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The vendor's HBM bandwidth by a word of the GPU's name: the goals are stated against it. Elsewhere, and beside
# it, the device-to-device copy bandwidth each benchmark measured in its own run.
DATASHEET_GBS = {"H200": 4800.0}


@dataclass
class StepResult:
    name: str
    status: str
    seconds: float
    cap_s: int
    limit_s: float | None = None
    command: list[str] | None = None


@dataclass
class Goal:
    goal: str
    target: float
    unit: str  # "%" of a bandwidth, "x" a ratio
    value: float | None = None  # None: not measured in this run
    met: bool | None = None
    detail: str = ""

    def measured(self, value: float, detail: str) -> None:
        self.value, self.met, self.detail = value, value >= self.target, detail


@dataclass
class Run:
    budget_s: int
    arch: str
    preset_arch: str | None
    python: str
    commit: str | None
    total_s: float = 0.0
    steps: list[StepResult] = field(default_factory=list)
    machine: dict = field(default_factory=dict)
    tests: dict = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)

    def add(self, name: str, status: str, seconds: float, cap_s: int, limit_s: float | None = None,
            command: list[str] | None = None) -> None:
        self.steps.append(StepResult(name, status, round(seconds, 1), cap_s, limit_s and round(limit_s), command))

    def all_ok(self) -> bool:
        return all(s.status == "ok" for s in self.steps)

    def collect(self, work: Path) -> None:
        """Read what the steps left in work/: the preflight's facts, the tests' records, the benchmarks' JSON."""
        self.machine = read_json(work / "preflight.json") or {}
        self.tests = {p.stem: test_counts(p) for p in sorted((work / "tests").glob("*.jsonl"))}
        self.goals = goals(work, self.machine.get("gpu") or "", self.tests, self.steps)
        self.goals.insert(1, invariance(work))

    def as_json(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "goals"}
        out["goals"] = [asdict(g) for g in self.goals]
        return out

    def markdown(self) -> str:
        m = self.machine
        gpu = f"{m['gpu']} ({m.get('capability')})" if m.get("gpu") else "no GPU seen"
        lines = [f"# GPU check: {gpu}, {self.total_s:.0f} s of a {self.budget_s} s budget", "",
                 f"commit {self.commit or 'unknown'}; kernels built for {self.arch} (TORCH_CUDA_ARCH_LIST preset: "
                 f"{self.preset_arch or 'none'}); torch {m.get('torch', '?')} (CUDA {m.get('torch_cuda', '?')}); "
                 f"{self.python}", "", "| step | status | seconds | cap |", "|---|---|---|---|"]
        lines += [f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.cap_s} |" for s in self.steps]
        if self.tests:
            lines += ["", "| tests | passed | failed | errors | skipped | note |", "|---|---|---|---|---|---|"]
            lines += [f"| {name} | {c['passed']} | {c['failed']} | {c['errors']} | {c['skipped']} | {c['note']} |"
                      for name, c in self.tests.items()]
        lines += ["", "| goal | measured | target | met | detail |", "|---|---|---|---|---|"]
        for g in self.goals:
            value = "not measured" if g.value is None else f"{g.value:.3g}{g.unit}"
            met = {None: "-", True: "yes", False: "NO"}[g.met]
            lines.append(f"| {g.goal} | {value} | {g.target:g}{g.unit} | {met} | {g.detail} |")
        return "\n".join(lines) + "\n"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_counts(path: Path) -> dict:
    """Counts from scripts/pytest_deadline.py's records; a test that started and never reported is the one that
    was running when the process ended (its deadline, the step's limit, or a crash)."""
    counts = dict(passed=0, failed=0, errors=0, skipped=0, note="")
    started, ended, failures, stop = [], set(), [], None
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("event") == "start":
            started.append(r["nodeid"])
        elif r.get("event") == "stop":
            stop = r.get("message")
        elif r.get("event") == "report":
            ended.add(r["nodeid"])
            if r["outcome"] == "skipped":
                counts["skipped"] += 1
            elif r["when"] == "call":
                counts["passed" if r["outcome"] == "passed" else "failed"] += 1
            elif r["outcome"] == "failed":  # in setup or teardown
                counts["errors"] += 1
            if r["outcome"] == "failed":
                failures.append(r["nodeid"].split("::")[-1])
    notes = []
    if failures:
        notes.append("failed: " + ", ".join(failures[:5]) + (f" and {len(failures) - 5} more" if len(failures) > 5
                                                               else ""))
    if started and started[-1] not in ended:
        notes.append(f"running when the process ended: {started[-1].split('::')[-1]}")
    if stop:
        notes.append(f"stopped: {stop}")
    counts["note"] = "; ".join(notes)
    return counts


INVARIANCE_TEST = "test_cuda_decode_steps_and_verify_passes_give_the_same_bits"


def invariance(work: Path) -> Goal:
    """Speculative output is plain decoding's where a position's logits are the same bits in a decode step and a
    verify pass of any T: the share of tests/test_batch_invariance.py's CUDA cases that passed."""
    goal = Goal("speculative = plain: a decode step's logits and a verify pass's (T = 1..17, int8, q4 with "
                "its q8 head, fp16, bf16) the same bits", 100, "%", detail="no case ran")
    outcomes = {}
    for path in sorted((work / "tests").glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("event") == "report" and INVARIANCE_TEST in r.get("nodeid", "") and r.get("when") == "call":
                outcomes[r["nodeid"].split("[")[-1].rstrip("]")] = r["outcome"]
    if outcomes:
        bad = sorted(case for case, outcome in outcomes.items() if outcome != "passed")
        goal.measured(100 * (len(outcomes) - len(bad)) / len(outcomes),
                      f"{len(outcomes) - len(bad)} of {len(outcomes)} cases" + (f"; not: {', '.join(bad)}" if bad
                                                                                else ""))
    return goal


def bandwidth(value_gbs: float, gpu: str, copy_gbs: float | None) -> tuple[float, str]:
    """(% of the datasheet bandwidth where this GPU's is known, else of the measured copy bandwidth; detail)."""
    sheet = next((v for k, v in DATASHEET_GBS.items() if k in gpu), None)
    copy = f"{100 * value_gbs / copy_gbs:.0f}% of the {copy_gbs:.0f} GB/s copy bandwidth measured" if copy_gbs else ""
    if sheet:
        return 100 * value_gbs / sheet, f"{value_gbs:.0f} GB/s of the datasheet's {sheet:.0f}; {copy}"
    return 100 * value_gbs / copy_gbs, f"{value_gbs:.0f} GB/s; {copy} (no datasheet figure for {gpu or 'this GPU'})"


def rows(result: dict | None, **match) -> list[dict]:
    return [r for r in (result or {}).get("rows", []) if all(r.get(k) == v for k, v in match.items())]


def goals(work: Path, gpu: str, tests: dict, steps: list[StepResult]) -> list[Goal]:
    """The goals of a first run on a GPU, from what this run measured."""
    out = []
    ran = [s for s in steps if s.name.startswith("test_")]
    bad = sum(c["failed"] + c["errors"] for c in tests.values())
    passed = sum(c["passed"] for c in tests.values())
    every = Goal("every CUDA test passes", 100, "%", detail="no test step ran")
    if passed + bad:
        unfinished = [f"{s.name}: {s.status}" for s in ran if s.status != "ok"]
        every.measured(100 * passed / (passed + bad), f"{passed} passed, {bad} failed or errors" +
                       "".join(f"; {u}" for u in unfinished))
        every.met = every.met and not unfinished and len(ran) == 3
    out.append(every)

    latency = read_json(work / "goals" / "latency-cuda.json")
    copy = (latency or {}).get("bandwidth_gbs")
    step = Goal("fused + graphed TinyLlama-shape bf16 decode step streams >= 65% of HBM bandwidth", 65, "%")
    hit = rows(latency, shape="tinyllama", weights="bf16", kernels="fused", graph=True, batch=1)
    if hit and hit[0].get("gb_s"):
        pct, detail = bandwidth(hit[0]["gb_s"], gpu, copy)
        step.measured(pct, f"{hit[0]['ms_per_step']:.3g} ms a step; {detail}")
    out.append(step)

    speedup = Goal("graph >= 3x eager, default model's shape (bf16, fused, batch 1)", 3, "x")
    eager = rows(latency, shape="default", weights="bf16", kernels="fused", graph=False, batch=1)
    graph = rows(latency, shape="default", weights="bf16", kernels="fused", graph=True, batch=1)
    if eager and graph:
        speedup.measured(eager[0]["ms_per_step"] / graph[0]["ms_per_step"],
                         f"{eager[0]['ms_per_step']:.3g} ms eager, {graph[0]['ms_per_step']:.3g} ms graphed")
    out.append(speedup)

    gemv = read_json(work / "bench" / "gemv-cuda.json")
    q4 = Goal("q4 GEMV (a decode step's projections, T = 1) >= 70% of HBM bandwidth", 70, "%")
    hit = rows(gemv, weights="q4", tokens=1)
    if hit:
        q4.measured(*bandwidth(hit[0]["gb_s"], gpu, gemv.get("copy_bandwidth_gb_s")))
    out.append(q4)

    attention = read_json(work / "bench" / "attention-cuda.json")
    attn = Goal("decode attention at 32k >= 65% of HBM bandwidth (every shape)", 65, "%")
    hit = rows(attention, context=32768, window=0, impl="decodescope")
    if hit:
        figures = [(r["shape"], *bandwidth(r["gb_s"], gpu, attention.get("copy_bandwidth_gb_s"))) for r in hit]
        attn.measured(min(pct for _, pct, _ in figures),
                      "; ".join(f"{shape}: {pct:.0f}% ({detail})" for shape, pct, detail in figures))
    out.append(attn)
    return out
