"""The sentences the page says about a run: what the drafter chose, how many rounds drafted and why the others
were plain steps, and what a verify pass cost where that is what held it back. Every figure comes from Stats (its
summary, its rounds' k, drafts and times) or from a committed benchmark it names; nothing is measured here."""
from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

from engine.observe.provenance import cpu_info
from engine.request import Request
from engine.speculative.schedule import MIN_GAIN
from engine.stats import Stats, finite


def drafter_note(stats: Stats) -> str:
    """What the drafter chose at the start of the run, in a line (the layers a layer-skip drafter skips)."""
    info = stats.drafter_info
    if info.get("skipped_layers"):
        how = "calibrated on the prompt" if info.get("layer_set") == "calibrated" else "given"
        note = (f"runs {info['draft_layers']} of {info['target_layers']} layers, skips {info['skipped_layers']} "
                f"({how}")
        if info.get("calibrated_acceptance") is not None:
            note += f"; {info['calibrated_acceptance']:.0%} expected acceptance"
        return note + ")"
    if info.get("draft_weights"):
        return f"drafts with {info['draft_layers']} layers in {info['draft_weights']} weights"
    if info.get("session_tokens"):
        return f"drafts from this tab's earlier answers too ({info['session_tokens']} tokens)"
    return ""


def drafting_counts(stats: Stats) -> tuple[int, int]:
    """(rounds whose drafts the target verified, decode rounds): round 0 is the prefill and drafts nothing."""
    decode = stats.rounds[1:]
    return sum(1 for r in decode if r.n_drafted), len(decode)


def schedule_note(stats: Stats) -> str:
    """How many rounds drafted and why the rest were plain steps, for a speculative run ("" for a plain one)."""
    if stats.settings.get("mode", "plain") == "plain" or len(stats.rounds) < 2:
        return ""
    drafted, rounds = drafting_counts(stats)
    s = stats.summary()
    head = f"Drafted in {drafted} of {rounds} rounds"
    if drafted == rounds:  # nothing to explain, and the stats line already counts them
        return ""
    if not stats.settings.get("adaptive", True):
        return (f"{head}: with a fixed k a round drafts whenever the drafter has a proposal, so the "
                f"{rounds - drafted} plain steps are rounds where it had none.")
    info = stats.drafter_info
    if info.get("sits_out"):
        return (f"{head}: drafting cannot pay here ({info['sits_out']}), so every round was a plain step and "
                "nothing was probed.")
    why = (f"{head}; the other {rounds - drafted} were plain steps. The adaptive schedule drafts only where this "
           f"run's measured acceptance and costs say a draft beats a plain step by {MIN_GAIN - 1:.0%}, probes with "
           "one draft where it cannot tell, and makes a plain step where the drafter has nothing to propose.")
    evidence = []
    if drafted:
        acc = finite(s.get("acceptance_rate"))
        if acc is not None:
            evidence.append(f"{acc:.0%} of the drafts were accepted")
        overhead = finite(s.get("draft_overhead_pct"))
        if overhead is not None:
            evidence.append(f"draft overhead {overhead:.0f}%")
    if info.get("calibrated_acceptance") is not None and info.get("draft_layers"):
        evidence.append(f"the layer-skip calibration expected {info['calibrated_acceptance']:.0%} acceptance from a "
                        f"draft that runs {info['draft_layers']} of {info['target_layers']} layers")
    return why + (" Here " + "; ".join(evidence) + "." if evidence else "")


# A verify position costing more than this share of a plain step is what holds q4's speculative runs back on a CPU
# whose integer products are slow (AVX2 without VNNI: 0.42 on the project's copy set, against q4_a8's 0.21)
VERIFY_NOTE_SLOPE = 0.3


def verify_slope(stats: Stats) -> float | None:
    """What one verified position cost over a plain step in this run: the median over drafted rounds of
    (target_ms / the plain rounds' median target_ms - 1) / drafts; None without 3 plain rounds and a drafted one."""
    plain = [r.target_ms for r in stats.rounds[1:] if r.k is not None and not r.n_drafted]
    drafted = [(r.target_ms, r.n_drafted) for r in stats.rounds[1:] if r.n_drafted]
    if len(plain) < 3 or not drafted or statistics.median(plain) <= 0:
        return None
    step = statistics.median(plain)
    return statistics.median((ms / step - 1) / n for ms, n in drafted)


RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def results_file(stem: str, kind: str | None, results: Path = RESULTS) -> Path:
    """bench/results/<stem>-<kind>.json where that kind of CPU has its own, else <stem>.json."""
    own = results / f"{stem}-{kind}.json"
    return own if kind and own.exists() else results / f"{stem}.json"


@functools.cache
def q4_a8_evidence(results: Path = RESULTS, kind: str | None = None) -> str:
    """What the committed benchmarks measured for q4_a8 against q4, as a clause: the copy set's n-gram speedup at
    the page's k for each (bench/results/spec-cpu-q4-q4_a8, this kind of CPU's own file where it has one: `kind`,
    by default this machine's), the CPU it ran on, and q4_a8's top-1 against the file's exact values
    (bench/results/quality-cpu, likewise); "" where those files are not here (an installed package)."""
    kind = kind or cpu_info().get("cpu_kind")  # as benchmark files name it: zen4, emerald-rapids, ...
    spec_file = results_file("spec-cpu-q4-q4_a8", kind, results)
    quality_file = results_file("quality-cpu", kind, results)
    try:
        spec = json.loads(spec_file.read_text())
        quality = json.loads(quality_file.read_text())
    except (OSError, ValueError):
        return ""
    k = Request().k
    speedup = {r["target"]: r["speedup"] for r in spec["rows"]
               if (r["set"], r["temperature"], r["mode"], r["k"]) == ("edit", 0.0, "ngram", k)}
    top1 = {r["weights"]: r["top1_agreement"] for r in quality["rows"]}
    if not {"q4", "q4_a8"} <= speedup.keys() or "q4_a8" not in top1:
        return ""
    cpu = spec["provenance"].get("telemetry", {})
    ran = f"{cpu['cpu_model']}, {cpu['cpu_kind']}" if cpu.get("cpu_kind") else cpu.get("cpu_model")
    on = f"on {ran} ({cpu['cpu_flags']})" if ran else "on a CPU"
    return (f"; {on} the copy set's n-gram speedup at k={k} went from {speedup['q4']:.2f}x to "
            f"{speedup['q4_a8']:.2f}x (bench/results/{spec_file.stem}), at {top1['q4_a8']:.1%} top-1 against the "
            f"file's exact values (bench/results/{quality_file.stem})")


def verify_note(stats: Stats, weights: str) -> str:
    """Where a q4 run's verify passes cost much of a step each (16-bit activations on a CPU whose integer products
    are slow), that q4_a8 halves that work and what it gave in the benchmark; "" otherwise."""
    slope = verify_slope(stats) if weights == "q4" else None
    if slope is None or slope < VERIFY_NOTE_SLOPE:
        return ""
    return (f"Each verified position cost {slope:.2f} of a plain step in this run: q4's CPU kernels take the "
            "activations at 16 bits, and on this CPU that integer work is what a drafted token pays. q4_a8 (the same "
            "blocks against 8-bit activations, llama.cpp's recipe and the launch's format on a CPU: Weights q4_a8) "
            f"does half of it{q4_a8_evidence()}.")
