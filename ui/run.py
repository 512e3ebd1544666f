"""A run's lifecycle on the page, the one module every handler imports: a tab's Session, the LiveRun it streams,
the settings read from the page (a Request), the refusal a bad one gets, the Runtime of the picked model, and the
record a finished run leaves (begin_run / record_run). Nothing here knows which backend runs a request
(ui/backends.py chooses) or touches the engine.
"""
from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass

import gradio as gr

from engine.request import Request
from engine.speculative import SessionIndex
from engine.stats import Round, finite
from ui import export, render
from ui.models import Runtimes
from ui.runtime import RunFacts, Runtime, ceiling_gbs

RUN_HEADERS = ["run", "label", "model", "tokens", "TTFT ms", "ITL p50 ms", "ITL p99 ms", "tok/s", "speedup",
               "acceptance", "mean accepted", "stopped"]


@dataclass
class LiveRun:
    rounds: list[Round]  # the pump's `arrived`: appended by its thread, read as a copy
    prompt_len: int
    settings: dict
    facts: list[RunFacts]  # the pump's: the bandwidth probe before the run is in once the first round is
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
        # this tab's answers, which its later n-gram runs draft from too: a stranger's answers never (a rejected
        # draft is shown); Compare's and the baselines' runs neither read nor add to it, so their figures stay
        # what one request alone gives
        self.earlier = SessionIndex()

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


def parse_settings(values: dict) -> Request:
    """The settings by name, as the page's widgets or an API client send them (a setting not sent keeps the
    record's default), as a Request; ValueError naming a bad value and what the setting accepts."""
    return Request.from_values(values)


def refusal(message: str) -> gr.Error:
    """The error a refused or failed run raises: API clients get it as an error; on the page the event has
    already put it where the output goes (error_html), so no toast fades over it."""
    return gr.Error(message, print_exception=False, visible=False)


def runtime_for(models: Runtimes, values: dict, shown=lambda html: html):
    """Generator: the Runtime of the run's model setting, as its return value. On the model's first pick it
    first yields shown(a note saying it loads), since that takes a while; gr.Error naming a bad model or why its
    load failed (the other models keep serving)."""
    try:
        title = models.check(parse_settings(values).model)
        if not models.is_built(title):
            yield shown(render.message_html(models.loading_note(title)))
        return models.get(title)
    except ValueError as e:
        raise refusal(str(e)) from None


def starting(rt: Runtime, s: Request) -> str:
    """What the run is about to do, said before it starts: a weight format's first run loads it first."""
    fmt = s.weights or rt.weight_format
    if s.on_endpoint or rt.loaded(fmt):
        return f"Running {s.label()}."
    return f"Loading the {fmt} weights (their first run; a few seconds), then running {s.label()}."


def ceiling_note(facts: list[RunFacts]) -> str | None:
    """How the bandwidth ceiling of a run was measured (the tooltip of its % of the ceiling)."""
    probes = [f"{f.when} the run {f.bandwidth_gbs:.1f} GB/s" for f in facts if finite(f.bandwidth_gbs) is not None]
    weight_bytes = next((f.weight_bytes for f in facts if f.weight_bytes), 0)
    if not probes or not weight_bytes:
        return None
    return (f"decode tok/s over the fastest a step could stream its {weight_bytes / 1e6:.0f} MB of weights: the "
            f"bandwidth measured {' and '.join(probes)}, the larger ({ceiling_gbs(facts):.1f} GB/s)")


def runs_table(session: Session) -> list[list]:
    """The session's runs, newest first (the table shows its first rows)."""
    def num(x, nd):
        return None if (x := finite(x)) is None else round(x, nd)

    rows = []
    for i, r in reversed(list(enumerate(session.history, 1))):
        s = r.summary
        acc = finite(s.get("acceptance_rate"))
        rows.append([
            i, r.label, r.settings.get("model"), s["tokens"], num(s["ttft_ms"], 1), num(s["itl_p50_ms"], 2),
            num(s["itl_p99_ms"], 2), num(s["decode_tok_s"], 1), speedup(s), None if acc is None else f"{acc:.0%}",
            num(s["mean_accepted_len"], 2), "yes" if r.stopped else "",
        ])
    return rows


def speedup(summary: dict) -> str | None:
    """The runs table's speedup cell: "×1.80 vs plain", against the baseline the run names (Compare's group's)."""
    x = finite(summary.get("speedup"))
    return None if x is None else f"×{x:.2f} vs {summary.get('speedup_over') or 'baseline'}"


def record_run(rt: Runtime, session: Session, stats, label: str, stopped: bool,
               extra: dict | None = None) -> tuple[str, str, str]:
    """Add a finished run to the session; write its token CSV, trace and the session's summary CSV. extra: more
    summary columns (a Compare run's speedup_over)."""
    run_id = session.next_run_id()
    session.history.append(RunRecord(run_id, label, {**stats.summary(), **(extra or {})}, stats.settings, stopped))
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
