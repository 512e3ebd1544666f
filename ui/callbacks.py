"""The functions the page's events call. Plain module-level functions: the runtime is bound in by
layout.py, per-session data arrives as a Session (gr.State), and every one can be called from a test.
"""
from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass, replace

import gradio as gr

from engine.stats import Round
from ui import export, plots, render
from ui.runtime import RoundPump, RunSettings, Runtime, as_int

STREAM_INTERVAL_S = 1 / 15  # token updates to the page, at most this often
PLOT_INTERVAL_S = 2.0  # figures cost far more (to build, send and draw): refreshed this often mid-run
IDLE_TICK_S = 0.25  # a Compare run yields this often, so a closed tab or Stop is noticed
SETTINGS_FIELDS = ("mode", "k", "ngram", "layers", "draft_model", "cuda_graphs", "fused_kernels", "chat",
                   "temperature", "top_p", "top_k", "seed", "max_new_tokens")
INT_FIELDS = ("k", "ngram", "layers", "top_k", "seed", "max_new_tokens")
RUN_HEADERS = ["run", "label", "tokens", "TTFT ms", "ITL p50 ms", "ITL p99 ms", "tok/s", "acceptance",
               "mean accepted", "stopped"]


@dataclass
class RunRecord:
    run_id: str
    label: str
    summary: dict
    settings: dict
    stopped: bool = False


class Session:
    """One browser tab's data: its run history and the stop flag of its run on the engine.

    A plain class (not a dataclass) because gr.State is handed the class and makes one per session."""

    def __init__(self):
        self.id = uuid.uuid4().hex[:8]
        self.history: list[RunRecord] = []
        self.run_stop = threading.Event()
        self.submitted_at: float | None = None  # when the page queued its last run (see submit)
        self.stopped_at = -math.inf

    def __deepcopy__(self, memo):
        # gradio deep-copies each session's fresh value (an Event cannot be copied); it is already fresh
        return self

    @property
    def compare_dir(self) -> str:
        return f"{self.id}-compare"

    def next_run_id(self) -> str:
        return f"{self.id}-{len(self.history) + 1}"


def parse_settings(*values) -> RunSettings:
    """The settings widgets' values, in SETTINGS_FIELDS order, as RunSettings (ValueError naming a bad one)."""
    d = dict(zip(SETTINGS_FIELDS, values, strict=True))
    for name in INT_FIELDS:
        d[name] = as_int(name.replace("_", " "), d[name])
    for name in ("temperature", "top_p"):
        try:
            d[name] = float(d[name])
        except (TypeError, ValueError):
            raise ValueError(f"{name}={d[name]!r} must be a number") from None
    for name in ("cuda_graphs", "fused_kernels", "chat"):
        d[name] = bool(d[name])
    return RunSettings(**d)


def prepare(rt: Runtime, prompt: str, values) -> tuple[RunSettings, list[int]]:
    """Settings and prompt ids, or gr.Error saying what to change; nothing has touched the engine yet."""
    if not prompt or not prompt.strip():
        raise gr.Error("The prompt is empty: type something or pick an example.", print_exception=False)
    try:
        s = parse_settings(*values)
        ids = rt.encode(prompt, s.chat)
        rt.validate(s, ids)
    except ValueError as e:
        raise gr.Error(str(e), print_exception=False) from None
    return s, ids


def runs_table(session: Session) -> list[list]:
    def num(x, nd):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(x, nd)

    rows = []
    for i, r in enumerate(session.history, 1):
        s = r.summary
        acc = s.get("acceptance_rate")
        rows.append([
            i, r.label, s["tokens"], num(s["ttft_ms"], 1), num(s["itl_p50_ms"], 2), num(s["itl_p99_ms"], 2),
            num(s["decode_tok_s"], 1), None if acc is None or math.isnan(acc) else f"{acc:.0%}",
            num(s["mean_accepted_len"], 2), "yes" if r.stopped else "",
        ])
    return rows


def record_run(rt: Runtime, session: Session, stats, label: str, stopped: bool) -> tuple[str, str, str]:
    """Add a finished run to the session; write its token CSV, trace and the session's summary CSV."""
    run_id = session.next_run_id()
    session.history.append(RunRecord(run_id, label, stats.summary(), stats.settings, stopped))
    folder = rt.store.run_dir(run_id)
    tokens = export.write_tokens_csv(folder / f"tokens-{run_id}.csv", run_id, stats, rt.text_of)
    trace = export.write_trace(folder / f"trace-{run_id}.json", run_id, stats)
    runs = write_history(rt, session, folder)
    return str(tokens), str(trace), runs


def write_history(rt: Runtime, session: Session, folder) -> str:
    rows = [export.summary_row(r.run_id, r.label, r.summary, r.settings) for r in session.history]
    return str(export.write_runs_csv(folder / f"runs-{session.id}.csv", rows))


def submit(session: Session) -> None:
    """Runs the moment Generate or Compare is clicked, before the run waits in the queue."""
    session.submitted_at = time.monotonic()


def stop(session: Session) -> str:
    """End this session's run after the round in flight, or drop the run it still has waiting in the queue."""
    session.stopped_at = time.monotonic()
    session.run_stop.set()
    return render.message_html("Stopping.")


def end_session(rt: Runtime, session: Session) -> None:
    """gr.State's delete callback: the tab is gone for good, so its run stops and its files go."""
    session.run_stop.set()
    rt.store.drop([r.run_id for r in session.history] + [session.compare_dir])


def begin_run(session: Session) -> bool:
    """A fresh stop flag for the run about to start; False when Stop was pressed while it was queued."""
    queued_at, session.submitted_at = session.submitted_at, None
    if queued_at is not None and session.stopped_at > queued_at:
        return False
    session.run_stop = threading.Event()
    return True


def figures(stats) -> tuple:
    return plots.itl_figure(stats), plots.steps_figure(stats), plots.acceptance_figure(stats)


def generate(rt: Runtime, session: Session, prompt: str, *values):
    """Stream one run. Yields (tokens html, stats html, status html, itl, steps, acceptance, runs table,
    token CSV, trace JSON, runs CSV)."""
    s, ids = prepare(rt, prompt, values)
    skip = gr.skip()
    if not begin_run(session):
        yield (skip, skip, render.message_html("Stopped before it started."), *[skip] * 7)
        return
    settings = s.as_dict(rt.model_name)
    yield ("", render.stats_line({}, running=True), render.message_html(f"Running {s.label()}."), *[skip] * 7)
    rounds: list[Round] = []
    html = ""
    last_plot = time.monotonic()
    pump = RoundPump(rt, s, ids, session.run_stop)
    try:
        for batch in pump.batches(STREAM_INTERVAL_S):
            if not batch:
                yield (skip,) * 10
                continue
            rounds += batch
            html += render.render_rounds(batch, rt.text_of)
            stats = rt.stats(rounds, len(ids), settings)
            yield (html, render.stats_line(stats.summary(), running=True), *[skip] * 8)
            if time.monotonic() - last_plot >= PLOT_INTERVAL_S:  # after the tokens went out, not before
                yield (skip, skip, skip, *figures(stats), *[skip] * 4)
                last_plot = time.monotonic()
    except ValueError as e:  # a setting only the engine could judge
        raise gr.Error(str(e), print_exception=False) from None
    finally:
        pump.close()
    stopped = not (rounds and rounds[-1].finished)
    stats = rt.stats(rounds, len(ids), settings)
    files = record_run(rt, session, stats, s.label(), stopped)
    n = len(session.history)
    note = f"Run {n} stopped after {len(stats.ids)} tokens." if stopped else f"Run {n} done: {s.label()}."
    yield (html, render.stats_line(stats.summary()), render.message_html(note), *figures(stats),
           runs_table(session), *files)


def run_to_end(rt: Runtime, session: Session, s: RunSettings, ids: list[int], tick: tuple):
    """Generator: runs s to the end yielding `tick` (no page update) now and then; returns its Stats,
    or None when the run was stopped."""
    rounds: list[Round] = []
    pump = RoundPump(rt, s, ids, session.run_stop)
    try:
        for batch in pump.batches(IDLE_TICK_S):
            rounds += batch
            yield tick
    except ValueError as e:
        raise gr.Error(str(e), print_exception=False) from None
    finally:
        pump.close()
    if not (rounds and rounds[-1].finished):
        return None
    return rt.stats(rounds, len(ids), s.as_dict(rt.model_name))


def compare_plan(rt: Runtime, s: RunSettings) -> list[tuple[str, str, RunSettings | None, str | None, bool]]:
    """(group, label, settings or None, reason it cannot run, baseline) for each configuration compared."""
    base = replace(s, mode="plain")
    spec = s if s.speculative else replace(s, mode="n-gram")
    plan = []
    if rt.graphs_reason:
        plan.append(("CUDA graphs", "CUDA graph", None, rt.graphs_reason, False))
    else:
        plan += [("CUDA graphs", "eager", replace(base, cuda_graphs=False), None, True),
                 ("CUDA graphs", "CUDA graph", replace(base, cuda_graphs=True), None, False)]
    if rt.fused_reason:
        plan.append(("kernels", "fused kernels", None, rt.fused_reason, False))
    else:
        plan += [("kernels", "torch ops", replace(base, fused_kernels=False), None, True),
                 ("kernels", "fused kernels", replace(base, fused_kernels=True), None, False)]
    plan += [("speculative", "plain", base, None, True), ("speculative", spec.mode_label(), spec, None, False)]
    return plan


def compare(rt: Runtime, session: Session, prompt: str, *values):
    """Run the prompt back to back under each configuration. Yields (status html, compare figure,
    compare table, runs table, runs CSV)."""
    s, ids = prepare(rt, prompt, values)
    skip = gr.skip()
    if not begin_run(session):
        yield (render.message_html("Stopped before it started."), *[skip] * 4)
        return
    plan = compare_plan(rt, s)
    for _, _, cfg, _, _ in plan:
        if cfg is not None:
            try:
                rt.validate(cfg, ids)
            except ValueError as e:
                raise gr.Error(f"Compare cannot run {cfg.label()}: {e}", print_exception=False) from None
    todo = list(dict.fromkeys(cfg for _, _, cfg, _, _ in plan if cfg is not None))
    done: dict[RunSettings, object] = {}
    for i, cfg in enumerate(todo, 1):
        yield (render.message_html(f"Compare {i}/{len(todo)}: {cfg.label()}"), *[skip] * 4)
        stats = yield from run_to_end(rt, session, cfg, ids, (skip,) * 5)
        if stats is None:
            yield (render.message_html(f"Compare stopped during {cfg.label()}."), *[skip] * 4)
            return
        done[cfg] = stats
        record_run(rt, session, stats, f"compare: {cfg.label()}", False)
    entries = [plots.CompareEntry(g, label, done.get(cfg), reason, base) for g, label, cfg, reason, base in plan]
    folder = rt.store.run_dir(session.compare_dir)
    yield (render.message_html(f"Compared {len(todo)} runs."), plots.compare_figure(entries),
           plots.compare_rows(entries), runs_table(session), write_history(rt, session, folder))
