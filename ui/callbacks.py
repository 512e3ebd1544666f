"""The functions the page's events call. Plain module-level functions: the runtime is bound in by
layout.py, per-session data arrives as a Session (gr.State), and every one can be called from a test.
"""
from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass

import gradio as gr

from engine.stats import Round, finite
from ui import endpoint, export, plots, render
from ui.runtime import RoundPump, RunSettings, Runtime, as_int

SETTINGS_FIELDS = ("mode", "k", "ngram", "layers", "draft_model", "cuda_graphs", "fused_kernels", "chat",
                   "temperature", "top_p", "top_k", "seed", "max_new_tokens", "adaptive", "weights", "window",
                   "backend", "endpoint", "endpoint_model", "server")
INT_FIELDS = ("k", "ngram", "layers", "top_k", "seed", "max_new_tokens", "window")
RUN_HEADERS = ["run", "label", "tokens", "TTFT ms", "ITL p50 ms", "ITL p99 ms", "tok/s", "acceptance",
               "mean accepted", "stopped"]


@dataclass
class LiveRun:
    rounds: list[Round]
    prompt_len: int
    settings: dict
    drawn: int = -1  # rounds the figures last showed


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
        self.live: LiveRun | None = None  # the streaming run, for the figures' own refresh
        self.last: tuple | None = None  # (Stats, (token CSV, trace, runs CSV)) of the last finished run
        self.last_compare: list | None = None  # CompareEntry list of the last Compare

    def __deepcopy__(self, memo):
        # gradio deep-copies each session's fresh value (an Event cannot be copied); it is already fresh
        return self

    @property
    def compare_dir(self) -> str:
        return f"{self.id}-compare"

    @property
    def profile_dir(self) -> str:
        return f"{self.id}-profile"

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
    for name in ("cuda_graphs", "fused_kernels", "chat", "adaptive"):
        d[name] = bool(d[name])
    d["weights"] = str(d["weights"] or "")
    d["backend"] = "endpoint" if d["backend"] in ("endpoint", endpoint.ENDPOINT) else "engine"
    for name in ("endpoint", "endpoint_model", "server"):
        d[name] = str(d[name] or "").strip()
    d["server"] = d["server"] or "auto"
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
        return None if (x := finite(x)) is None else round(x, nd)

    rows = []
    for i, r in enumerate(session.history, 1):
        s = r.summary
        acc = finite(s.get("acceptance_rate"))
        rows.append([
            i, r.label, s["tokens"], num(s["ttft_ms"], 1), num(s["itl_p50_ms"], 2), num(s["itl_p99_ms"], 2),
            num(s["decode_tok_s"], 1), None if acc is None else f"{acc:.0%}",
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


def stop(session: Session) -> None:
    """End this session's run after the round in flight, or drop the run it still has waiting in the queue.

    It writes no output: the run's own last update says how it ended, and a second writer to the status
    line could land after it and leave "Stopping." on the page."""
    session.stopped_at = time.monotonic()
    session.run_stop.set()


def end_session(rt: Runtime, session: Session) -> None:
    """gr.State's delete callback: the tab is gone for good, so its run stops and its files go."""
    session.run_stop.set()
    rt.store.drop([r.run_id for r in session.history] + [session.compare_dir, session.profile_dir])


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
    """Stream one run: yields (tokens html, stats html, status html), strings only.

    Every other output of a streaming event would cost gradio a component rebuild on each update, skipped
    or not, so figures refresh on their own timer (live_figures) and the run's figures, history and files
    follow once it ends (last_run)."""
    s, ids = prepare(rt, prompt, values)
    if s.on_endpoint:
        yield from endpoint.generate(rt, session, prompt, s, ids)
        return
    session.last = None
    if not begin_run(session):
        yield (gr.skip(), gr.skip(), render.message_html("Stopped before it started."))
        return
    settings = s.as_dict(rt.model_name)
    status = render.message_html(f"Running {s.label()}.")
    html, stats_html = "", render.stats_line({}, running=True)
    yield (html, stats_html, status)
    rounds: list[Round] = []
    session.live = LiveRun(rounds, len(ids), settings)
    pump = RoundPump(rt, s, ids, session.run_stop)
    try:
        for batch in pump.batches(rt.stream_interval_s):
            if batch:  # an empty batch still yields: that is when gradio can close a dropped run
                rounds += batch
                html += render.render_rounds(batch, rt.text_of)
                stats_html = render.stats_line(rt.stats(rounds, len(ids), settings).summary(), running=True)
            yield (html, stats_html, status)
    except ValueError as e:  # a setting only the engine could judge
        raise gr.Error(str(e), print_exception=False) from None
    finally:
        pump.close()
        session.live = None
    stopped = not (rounds and rounds[-1].finished)
    stats = rt.stats(rounds, len(ids), settings)
    files = record_run(rt, session, stats, s.label(), stopped)
    session.last = (stats, files)
    n = len(session.history)
    note = f"Run {n} stopped after {len(stats.ids)} tokens." if stopped else f"Run {n} done: {s.label()}."
    yield (html, render.stats_line(stats.summary()), render.message_html(note))


def live_figures(rt: Runtime, session: Session) -> tuple:
    """The timer's tick while a run streams: the three figures of the run so far, when it moved on."""
    live = session.live
    if live is None or len(live.rounds) == live.drawn:
        return (gr.skip(),) * 3
    rounds = list(live.rounds)
    live.drawn = len(rounds)
    # the latency panel only: drawing all three mid-run cost the engine ~10 % on a 2-core CPU
    return plots.itl_figure(rt.stats(rounds, live.prompt_len, live.settings)), gr.skip(), gr.skip()


def last_run(rt: Runtime, session: Session) -> tuple:
    """After a run: (itl, steps, acceptance figures, runs table, token CSV, trace JSON, runs CSV)."""
    if session.last is None:
        return (gr.skip(),) * 7
    stats, files = session.last
    return (*figures(stats), runs_table(session), *files)


def live_on() -> gr.Timer:
    return gr.Timer(active=True)


def live_off() -> gr.Timer:
    return gr.Timer(active=False)
