"""The Compare button: the current prompt back to back under eager vs CUDA graph, torch ops vs fused
kernels, fp32 vs every other weight format, full vs windowed attention, and plain vs the selected
speculative mode. A configuration the machine cannot run is listed with its reason instead; one that two
groups share runs once.

Like generate, the queued event yields only a status string; the figure, table and files follow from
last_compare once it ends.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace

import gradio as gr

from engine.stats import Round
from ui import compare_plots, endpoint, render
from ui.callbacks import (Session, begin_run, prepare, record_run, refusal, runs_table, runtime_for, starting,
                          write_history)
from ui.compare_plots import CompareEntry
from ui.models import Runtimes
from ui.pump import RoundPump
from ui.runtime import Runtime
from ui.settings import SINKS, RunSettings

IDLE_TICK_S = 0.25  # a run yields this often, so a closed tab or Stop is noticed
COMPARE_WINDOW = 512  # the attention group's window when the run itself attends in full


def plan(rt: Runtime, s: RunSettings, positions: int | None = None) -> list[tuple[str, str, RunSettings | None,
                                                                                  str | None, bool]]:
    """(group, label, settings or None, reason it cannot run, baseline) for each configuration compared.
    positions: the cache positions the run fills (prompt + new tokens); a window that covers them all changes
    nothing, so it is named as such rather than timed as an effect."""
    if s.on_endpoint:  # this engine against the endpoint, one bar each
        return endpoint.plan(rt, s)
    s = replace(s, weights=s.weights or rt.weight_format)  # named, so equal runs in two groups run once
    base = replace(s, mode="plain")
    spec = s if s.speculative else replace(s, mode="n-gram")
    out = []
    if rt.graphs_reason:
        out.append(("CUDA graphs", "CUDA graph", None, rt.graphs_reason, False))
    else:
        out += [("CUDA graphs", "eager", replace(base, cuda_graphs=False), None, True),
                ("CUDA graphs", "CUDA graph", replace(base, cuda_graphs=True), None, False)]
    if rt.fused_reason:
        out.append(("kernels", "fused kernels", None, rt.fused_reason, False))
    else:
        out += [("kernels", "torch ops", replace(base, fused_kernels=False), None, True),
                ("kernels", "fused kernels", replace(base, fused_kernels=True), None, False)]
    # weight formats: fp32 against each other format, all plain (the one knob that changes is the format)
    for fmt, why in rt.formats().items():
        if why is not None or fmt == "bf16":
            continue
        label = f"{fmt} weights"
        out.append(("weights", label, replace(base, weights=fmt), None, fmt == "fp32"))
    # attention: full against the run's window (or COMPARE_WINDOW when the run attends in full)
    window = base.window or COMPARE_WINDOW
    if positions is not None and positions <= window + SINKS:
        out.append(("attention", f"window {window} + {SINKS} sinks", None,
                    f"same as full attention at this context ({positions} positions fit in the window)", False))
    else:
        out += [("attention", "full", replace(base, window=0), None, True),
                ("attention", f"window {window} + {SINKS} sinks", replace(base, window=window), None, False)]
    out += [("speculative", "plain", base, None, True), ("speculative", spec.mode_label(), spec, None, False)]
    return out


def run_to_end(rt: Runtime, session: Session, s: RunSettings, ids: list[int], status: str, prompt: str = ""):
    """Generator: runs s, yielding `status` now and then; returns its Stats, or None if it was stopped."""
    if s.on_endpoint:
        return (yield from endpoint.run_to_end(rt, session, s, prompt, status))
    rounds: list[Round] = []
    pump = RoundPump(rt, s, ids, session.run_stop)
    try:
        for batch in pump.batches(IDLE_TICK_S):
            rounds += batch
            yield status
    except ValueError as e:
        yield render.error_html(f"{s.label()}: {e}", "Compare failed")
        raise refusal(f"Compare failed at {s.label()}: {e}") from None
    finally:
        pump.close()
    if not (rounds and rounds[-1].finished):
        return None
    return rt.stats(rounds, len(ids), s.as_dict(rt.model_name), pump.facts)


def compare(models: Runtimes, session: Session, prompt: str, *values):
    """Run each configuration of the plan once (shared ones once in all); yields the status html. A refused
    Compare says why in the status line, then raises (API clients get the error)."""
    session.last_compare = None
    try:
        rt = yield from runtime_for(models, values)
        s, ids = prepare(rt, prompt, values)
        configs = plan(rt, s, len(ids) + s.max_new_tokens)
        for _, _, cfg, _, _ in configs:
            if cfg is not None:
                try:
                    rt.validate(cfg, ids)
                except ValueError as e:
                    raise refusal(f"Compare cannot run {cfg.label()}: {e}") from None
    except gr.Error as e:
        yield render.error_html(e.message)
        raise
    if not begin_run(session):
        yield render.message_html("Stopped before it started.")
        return
    todo = list(dict.fromkeys(cfg for _, _, cfg, _, _ in configs if cfg is not None))
    done = {}
    for i, cfg in enumerate(todo, 1):
        status = render.message_html(f"Compare {i}/{len(todo)}: {starting(rt, cfg)}")
        stats = yield from run_to_end(rt, session, cfg, ids, status, prompt)
        if stats is None:
            record(rt, session, configs, done)
            yield render.message_html(f"Compare stopped during {cfg.label()}.")
            return
        done[cfg] = stats
    session.last_compare = record(rt, session, configs, done)
    yield render.message_html(f"Compared {len(todo)} runs.")


def record(rt: Runtime, session: Session, configs, done: dict) -> list[CompareEntry]:
    """Every run into the session's history, in the order it ran, each with its speedup over the baseline of
    the first group that compares it (speedup_over names that baseline); returns the Compare's entries."""
    out = entries(configs, done)
    first = {}
    for e, (_, _, cfg, _, _) in zip(out, configs, strict=True):
        if cfg in done and (cfg not in first or (first[cfg].speedup is None and e.speedup is not None)):
            first[cfg] = e
    for cfg in done:
        e = first[cfg]
        record_run(rt, session, e.stats, f"compare: {cfg.label()}", False,
                   dict(speedup_over=e.baseline_label if e.speedup is not None else None))
    return out


def entries(configs, done: dict) -> list[CompareEntry]:
    """One entry per configuration; a non-baseline run's stats carry its group's baseline tok/s, so its
    summary reports the speedup (a copy: one run can be a baseline in one group and compared in another)."""
    base = {g: (done[cfg].summary()["decode_tok_s"], label) for g, label, cfg, _, is_base in configs
            if is_base and cfg in done}
    out = []
    for g, label, cfg, why, is_base in configs:
        stats = done.get(cfg)
        over = ""
        if stats is not None and not is_base and g in base:
            stats = dataclasses.replace(stats, baseline_tok_s=base[g][0])
            over = base[g][1]
        out.append(CompareEntry(g, label, stats, why, is_base, run=cfg.label() if cfg else "", baseline_label=over))
    return out


def last_compare(rt: Runtime, session: Session) -> tuple:
    """After a Compare: (figure, table, runs table, runs CSV)."""
    if session.last_compare is None:
        return (gr.skip(),) * 4
    entries = session.last_compare
    folder = rt.store.run_dir(session.compare_dir)
    return (compare_plots.compare_figure(entries), compare_plots.compare_rows(entries), runs_table(session),
            write_history(rt, session, folder))
