"""The Profile button: N decode steps and one verify pass of the engine under the current settings, and of
one other configuration beside it (eager vs CUDA graph, torch ops vs fused kernels, another weight format),
profiled (engine/observe/profile.py) and drawn (ui/profile_plots.py). A configuration the machine cannot run is
shown with its reason. The event queues with Generate and Compare (concurrency_id="engine") and holds the
runtime's lock while it touches the engine.
"""
from __future__ import annotations

import csv
import json
import time
from dataclasses import replace
from pathlib import Path

import gradio as gr

from engine.observe import profile as engine_profile
from engine.observe.bandwidth import measure_gbs
from engine.observe.provenance import Telemetry
from engine import weights
from engine.request import as_int
from engine.weights import FORMATS
from ui import render
from ui.models import Runtimes
from ui.profile_plots import head_share, profile_figure, profile_rows
from ui.run import Session, parse_settings, refusal, runtime_for
from ui.runtime import PROBE_BYTES, PROBE_REPEATS, Runtime
from ui.startup import zero_gpu

AGAINST = ("kernels", "CUDA graphs", *(f"weights {f}" for f in FORMATS))  # what the second configuration flips
STEPS_RANGE = (2, 32)
DEFAULT_STEPS = 6
CSV_COLUMNS = ["configuration", "pass", "layer", "op_class", "calls", "ms", "pct_of_step", "bytes", "gbs",
               "pct_of_ceiling", "device", "kernels", "graphs", "weights", "k", "context", "note"]


INTRO = ("Profile runs a few decode steps and one verify pass (k + 1 tokens) of the engine under the current "
         "settings, with torch.profiler, and splits each step by layer and op class. The second configuration "
         "changes one thing (*compare with*); where this machine cannot run it, the reason is shown instead. "
         "*host* is Python between ops on CPU and the device waiting for the host on CUDA.")


def default_against(rt: Runtime) -> str:
    """The first comparison this machine can run: kernels, then CUDA graphs; kernels (with its reason) if none.

    A CPU launched in a quantized format compares with fp32 weights instead: the torch twin of int8 or q4
    dequantizes every weight on every call (a reference, not a runtime: tens of times slower than the
    kernels), so profiling it would keep the page waiting for seconds; "kernels" stays one pick away."""
    cpu_quantized = rt.engine.device.type == "cpu" and weights.get(rt.weight_format).quantized
    if cpu_quantized and rt.fused_reason is None and rt.formats().get("fp32", "") is None:
        return "weights fp32"
    return next((a for a, why in (("kernels", rt.fused_reason), ("CUDA graphs", rt.graphs_reason)) if why is None),
                "kernels")


def label(cfg: engine_profile.Config) -> str:
    return " · ".join(["graph" if cfg.graphs else "eager", "fused" if cfg.fused else "torch", cfg.weights])


def configs(rt: Runtime, s, against: str) -> list[engine_profile.Config]:
    """The current settings, then the same with one axis changed (the data engine.profile.compare takes)."""
    here = s.weights or rt.weight_format
    cur = engine_profile.Config("", fused=s.fused_kernels, graphs=s.cuda_graphs, weights=here)
    if against == "kernels":
        other = replace(cur, fused=not cur.fused)
    elif against == "CUDA graphs":
        other = replace(cur, graphs=not cur.graphs)
    elif against.startswith("weights ") and against.removeprefix("weights ") in FORMATS:
        other = replace(cur, weights=against.removeprefix("weights "))
    else:
        raise ValueError(f"compare with {against!r} is not one of {', '.join(AGAINST)}")
    out = [replace(cur, label=label(cur))]
    return out + ([replace(other, label=label(other))] if other != cur else [])


def known_reasons(rt: Runtime, cfg: engine_profile.Config) -> str | None:
    """Why cfg cannot run, when the launch already knows (so nothing is switched to find out)."""
    if (why := rt.formats().get(cfg.weights, f"{cfg.weights} is not a weight format")) is not None:
        return f"{cfg.weights} weights unavailable: {why}"
    if cfg.graphs and rt.graphs_reason:
        return f"CUDA graphs unavailable: {rt.graphs_reason}"
    if cfg.fused and rt.fused_reason:
        return f"fused kernels unavailable: {rt.fused_reason}"
    return None


def write_csv(path: Path, results: list) -> Path:
    """One row per (configuration, pass, layer, op class); a configuration that could not run, one row with its
    reason in `note`."""
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in results:
            if r.reason is not None:
                w.writerow(dict(configuration=r.config.label, weights=r.config.weights, note=r.reason))
            w.writerows(r.rows)
    return path


def write_trace(path: Path, results: list) -> Path:
    """The configurations' traces as one Trace Event JSON: each configuration's processes get their own pids,
    named after it, so Perfetto shows them one above the other."""
    events = []
    for i, r in enumerate(x for x in results if x.trace is not None):
        pids: dict = {}
        for ev in r.trace["traceEvents"]:
            ev = dict(ev)
            if "pid" in ev:
                ev["pid"] = pids.setdefault(ev["pid"], 1000 * (i + 1) + len(pids))
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                ev["args"] = dict(name=f"{r.config.label}: {ev.get('args', {}).get('name', '')}")
            events.append(ev)
        events += [dict(ph="M", pid=pid, name="process_name", args=dict(name=f"{r.config.label}: {orig}"))
                   for orig, pid in pids.items() if isinstance(orig, str)]
    path.write_text(json.dumps(dict(traceEvents=events, displayTimeUnit="ms"), allow_nan=False), encoding="utf-8")
    return path


def same_note(against: str, cfgs: list) -> str:
    """What the status says when "compare with" changes nothing (it names the current settings)."""
    if len(cfgs) > 1:
        return ""
    return (f"'compare with: {against}' is what the current settings already run, so one configuration was "
            "profiled; pick another to see two side by side. ")


def status_line(results: list, seconds: float, telemetry: dict, note: str = "") -> str:
    parts = []
    for r in results:
        if r.reason is not None:
            parts.append(f"{r.config.label}: not run ({r.reason})")
            continue
        s = next(x for x in r.summary if x["pass"] == "decode")
        head_ms, head_pct = head_share(r)
        parts.append(f"{r.config.label}: decode step {s['step_ms']:.1f} ms (the LM head {head_ms:.1f} ms, "
                     f"{head_pct:.0f}% of it profiled), op classes add up to {s['rows_vs_step']:.2f}× it, "
                     f"profiler cost {s['profiler_overhead_pct']:+.0f}%")
    flags = "; ".join(telemetry["flags"]) or "no flags"
    return f"Profiled in {seconds:.1f} s. {note}" + " | ".join(parts) + f". Machine: {flags}."


def run_profile(models: Runtimes, session: Session, prompt: str, against: str, steps, **values):
    """Yields (status html, figure, table, profile CSV, trace JSON): a status while it runs, then all five. A
    refused profile says why in its status line, then raises (API clients get the error)."""
    try:
        rt = yield from runtime_for(models, values, lambda status: (status, *(gr.skip(),) * 4))
        yield (render.message_html(f"Profiling the current settings and {against}."), *(gr.skip(),) * 4)
        outputs = profile_outputs(rt, session, prompt, against, steps, values)
    except gr.Error as e:
        yield (render.error_html(e.message), *(gr.skip(),) * 4)
        raise
    yield outputs


def profile_outputs(rt: Runtime, session: Session, prompt: str, against: str, steps, values: dict) -> tuple:
    t0 = time.perf_counter()
    try:
        s = parse_settings(values)
        n = as_int("profile steps", steps)
        if not STEPS_RANGE[0] <= n <= STEPS_RANGE[1]:
            raise ValueError(f"profile steps={n} is out of range; pick {STEPS_RANGE[0]}..{STEPS_RANGE[1]}")
        cfgs = configs(rt, s, against)
        ids = rt.encode(prompt, s.chat) if prompt and prompt.strip() else None
        if zero_gpu():
            raise ValueError("profiling needs the GPU for longer than a ZeroGPU call lends it; run the app locally")
        results = [engine_profile.Result(c, reason=why) for c in cfgs if (why := known_reasons(rt, c))]
        todo = [c for c in cfgs if not known_reasons(rt, c)]
        with rt.lock, Telemetry(rt.engine.device) as tel:
            engines = {c.weights: rt.engine_for(c.weights) for c in todo}  # a format's first use loads it
            # the ceiling the profile's GB/s are set against: probed before, between and after the configurations
            probe = (lambda: measure_gbs(rt.engine.device, PROBE_BYTES, PROBE_REPEATS)) if rt.probe_bandwidth else None
            results += engine_profile.compare(engines, todo, probe=probe, steps=n, k=s.k, context=ids)
    except ValueError as e:
        raise refusal(str(e)) from None
    results.sort(key=lambda r: cfgs.index(r.config))
    folder = rt.store.run_dir(session.profile_dir)
    stamp = time.strftime("%H%M%S")
    csv_path = write_csv(folder / f"profile-{stamp}.csv", results)
    trace_path = write_trace(folder / f"profile-trace-{stamp}.json", results)
    note = same_note(against, cfgs)
    status = render.message_html(status_line(results, time.perf_counter() - t0, tel.summary(), note))
    return status, profile_figure(results), profile_rows(results), str(csv_path), str(trace_path)
