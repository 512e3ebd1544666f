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

from engine.stats import Round, Stats, finite
from ui import endpoint, export, plots, render, stream
from ui.explain import schedule_note
from ui.models import Runtimes
from ui.pump import RoundPump
from ui.runtime import RunFacts, Runtime, ceiling_gbs
from ui.settings import RunSettings, as_int

SETTINGS_FIELDS = ("mode", "k", "ngram", "layers", "draft_model", "cuda_graphs", "fused_kernels", "chat",
                   "temperature", "top_p", "top_k", "seed", "max_new_tokens", "adaptive", "weights", "window",
                   "backend", "endpoint", "endpoint_model", "server", "model")
INT_FIELDS = ("k", "ngram", "layers", "top_k", "seed", "max_new_tokens", "window")
RUN_HEADERS = ["run", "label", "model", "tokens", "TTFT ms", "ITL p50 ms", "ITL p99 ms", "tok/s", "acceptance",
               "mean accepted", "stopped"]


KEEPALIVE_S = 2.0  # a streaming run's updates that change nothing; the tokens and stats go by ui/stream.py
STREAMED_NOTE = ("tok/s measured while this page streamed the tokens: on a CPU the browser's drawing shares the "
                 "cores with the engine (Compare streams nothing)")


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
    d["model"] = str(d["model"] or "")
    return RunSettings(**d)


def refusal(message: str) -> gr.Error:
    """The error a refused or failed run raises: API clients get it as an error; on the page the event has
    already put it where the output goes (error_html), so no toast fades over it."""
    return gr.Error(message, print_exception=False, visible=False)


def runtime_for(models: Runtimes, values, shown=lambda html: html):
    """Generator: the Runtime of the run's model setting, as its return value. On the model's first pick it
    first yields shown(a note saying it loads), since that takes a while; gr.Error naming a bad model or why its
    load failed (the other models keep serving)."""
    try:
        title = models.check(parse_settings(*values).model)
        if not models.is_built(title):
            yield shown(render.message_html(models.loading_note(title)))
        return models.get(title)
    except ValueError as e:
        raise refusal(str(e)) from None


def prepare(rt: Runtime, prompt: str, values) -> tuple[RunSettings, list[int]]:
    """Settings and prompt ids, or gr.Error saying what to change; nothing has touched the engine yet."""
    if not prompt or not prompt.strip():
        raise refusal("The prompt is empty: type something or pick an example.")
    try:
        s = parse_settings(*values)
        if not s.on_endpoint:  # the weights named: the label and the CSVs say which
            s = replace(s, weights=s.weights or rt.weight_format)
        ids = rt.encode(prompt, s.chat)
        rt.validate(s, ids)
    except ValueError as e:
        raise refusal(str(e)) from None
    return s, ids


def starting(rt: Runtime, s: RunSettings) -> str:
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
            num(s["itl_p99_ms"], 2), num(s["decode_tok_s"], 1), None if acc is None else f"{acc:.0%}",
            num(s["mean_accepted_len"], 2), "yes" if r.stopped else "",
        ])
    return rows


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


def figures(stats) -> tuple:
    return plots.itl_figure(stats), plots.steps_figure(stats), plots.acceptance_figure(stats)


def generate(models: Runtimes, session: Session, prompt: str, *values):
    """Stream one run: yields (tokens html, stats html, status html): strings, or gr.skip() while it streams.

    While the run streams, the tokens value is a marker naming the run: the page fetches the new spans and the
    stats line itself (ui/stream.py), and this event yields only the status once the first round arrived, and
    updates that change nothing every KEEPALIVE_S (gradio closes a dropped run at a yield). The last update
    carries the whole token HTML and the final stats line. Every other output of a streaming event would cost
    gradio a component rebuild on each update, skipped or not, so figures refresh on their own timer
    (live_figures) and the run's figures, history and files follow once it ends (last_run). A refused or failed
    run says why where the output goes and clears the stats and status of the run before, then raises (API
    clients get the error)."""
    session.last = None
    try:
        rt = yield from runtime_for(models, values, lambda status: (gr.skip(), gr.skip(), status))
        s, ids = prepare(rt, prompt, values)
    except gr.Error as e:
        yield (render.error_html(e.message), "", "")
        raise
    if s.on_endpoint:  # a serving engine's stream, through the same records (ui/endpoint.py)
        yield from endpoint.generate(rt, session, prompt, s, ids)
        return
    if not begin_run(session):
        yield (gr.skip(), gr.skip(), render.message_html("Stopped before it started."))
        return
    settings = s.as_dict(rt.model_name)
    # said before the pump starts: once it runs, the weights it loads would make starting() say "Running"
    said, running = starting(rt, s), f"Running {s.label()}."
    pump = RoundPump(rt, s, ids, session.run_stop)
    live = stream.open_stream(pump, lambda: render.stats_line(
        rt.stats(list(pump.arrived), len(ids), settings, pump.facts) if pump.arrived else None, running=True))
    session.live = LiveRun(pump.arrived, len(ids), settings, pump.facts)
    yield (live, "", render.message_html(said))  # the page shows the live stats line (stream.poll)
    try:
        for batch in pump.batches(KEEPALIVE_S):
            if batch and said != running:
                said = running
                yield (gr.skip(), gr.skip(), render.message_html(running))
            else:  # an update that changes nothing: that is when gradio can close a dropped run
                yield (gr.skip(),) * 3
    except ValueError as e:  # a setting only the engine could judge
        yield (render.error_html(str(e), "Run failed"), "", "")
        raise refusal(str(e)) from None
    finally:
        pump.close()
        stream.close_stream(live)
        session.live = None
    rounds = list(pump.arrived)
    stopped = not (rounds and rounds[-1].finished)
    stats = rt.stats(rounds, len(ids), settings, pump.facts)
    files = record_run(rt, session, stats, s.label(), stopped)
    session.last = (stats, files)
    n = len(session.history)
    note = f"Run {n} stopped after {len(stats.ids)} tokens." if stopped else f"Run {n} done: {s.label()}."
    path = next((f.path for f in pump.facts if f.path), "")
    if "requested" in path:  # graphs were asked for and did not capture: the run says what ran instead
        note += f" It ran {path}."
    html = render.render_rounds(rounds, rt.text_of, rt.special_ids)
    yield (html, final_stats(rt, stats, pump.facts), render.message_html(note))


def final_stats(rt: Runtime, stats, facts: list[RunFacts]) -> str:
    """The stats line of a finished run, with what its figures rest on: the ceiling's probes, how many rounds
    drafted and why, and on a CPU that the page shared the cores while it streamed."""
    notes = [n for n in (schedule_note(stats), STREAMED_NOTE if rt.engine.device.type == "cpu" else "") if n]
    return render.stats_line(stats, ceiling=ceiling_note(facts), notes=notes)


def live_figures(rt: Runtime, session: Session) -> tuple:
    """The timer's tick while a run streams: the three figures of the run so far, when it moved on."""
    live = session.live
    if live is None or len(live.rounds) == live.drawn:
        return (gr.skip(),) * 3
    rounds = list(live.rounds)
    live.drawn = len(rounds)
    # the latency panel only: drawing all three mid-run cost the engine ~10 % on a 2-core CPU
    return plots.itl_figure(rt.stats(rounds, live.prompt_len, live.settings, live.facts)), gr.skip(), gr.skip()


def last_run(rt: Runtime, session: Session) -> tuple:
    """After a run: (itl, steps, acceptance figures, runs table, token CSV, trace JSON, runs CSV)."""
    if session.last is None:  # a refused or failed run: empty figures (an API client cannot read a skip)
        return (*figures(Stats([], 0)), runs_table(session), None, None, None)
    stats, files = session.last
    return (*figures(stats), runs_table(session), *files)


def submit_live(session: Session) -> gr.Timer:
    """submit, for Generate: and the live figures' timer on, in the same event (one event fewer at the start
    of a run, each a few milliseconds of the browser's script that the engine's cores pay for)."""
    submit(session)
    return gr.Timer(active=True)


def live_off() -> gr.Timer:
    return gr.Timer(active=False)
