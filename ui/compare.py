"""The Compare button: the current prompt back to back under eager vs CUDA graph, torch ops vs fused
kernels, fp32 vs every other weight format, full vs windowed attention, and plain vs the selected
speculative mode. A configuration the machine cannot run is listed with its reason instead; one that two
groups share runs once.

Like generate, the queued event yields only a status string; the figure, table and files follow from
last_compare once it ends.
"""
from __future__ import annotations

import dataclasses

import gradio as gr

from engine.request import Request
from ui import backends, compare_plots, render
from ui.compare_plots import CompareEntry
from ui.models import Runtimes
from ui.run import Session, begin_run, record_run, refusal, runs_table, runtime_for, starting, write_history
from ui.runtime import Runtime


def plan(rt: Runtime, s: Request, positions: int | None = None) -> list[tuple[str, str, Request | None, str | None,
                                                                            bool]]:
    """(group, label, settings or None, reason it cannot run, baseline) for each configuration compared: the
    backend's plan (ui/local.py for this engine; with an endpoint, this engine against it). positions: the cache
    positions the run fills (prompt + new tokens), so a window that covers them all is named, not timed."""
    return backends.of(s).plan(rt, s, positions)


def compare(models: Runtimes, session: Session, prompt: str, **values):
    """Run each configuration of the plan once (shared ones once in all); yields the status html. A refused
    Compare says why in the status line, then raises (API clients get the error)."""
    session.last_compare = None
    try:
        rt = yield from runtime_for(models, values)
        s, ids = backends.prepare(rt, prompt, values)
        configs = plan(rt, s, len(ids) + s.max_new_tokens)
        for _, _, cfg, _, _ in configs:
            if cfg is not None:
                try:
                    backends.of(cfg).check(rt, cfg, ids)
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
        stats = yield from backends.of(cfg).run_to_end(rt, session, cfg, ids, status, prompt)
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
