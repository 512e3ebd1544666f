"""What Generate and the live figures do. Plain module-level functions: the models are bound in by layout.py,
per-session data arrives as a Session (gr.State), the settings arrive by name, and every one can be called from a
test. The run's lifecycle is ui/run.py's; which backend runs it, ui/backends.py's.
"""
from __future__ import annotations

import gradio as gr

from engine.stats import Stats
from ui import backends, plots, render
from ui.models import Runtimes
from ui.run import Session, runs_table, runtime_for, submit
from ui.runtime import Runtime


def generate(models: Runtimes, session: Session, prompt: str, **values):
    """Stream one run: yields (tokens html, stats html, status html), strings or gr.skip() while it streams (the
    backend's generate says how). values: the settings by name (engine.request.NAMES; one not sent keeps its
    default). A refused or failed run says why where the output goes and clears the stats and status of the run
    before, then raises (API clients get the error)."""
    session.last = None
    try:
        rt = yield from runtime_for(models, values, lambda status: (gr.skip(), gr.skip(), status))
        s, ids = backends.prepare(rt, prompt, values)
    except gr.Error as e:
        yield (render.error_html(e.message), "", "")
        raise
    yield from backends.of(s).generate(rt, session, prompt, s, ids)


def figures(stats) -> tuple:
    return plots.itl_figure(stats), plots.steps_figure(stats), plots.acceptance_figure(stats)


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


def buttons(running: bool) -> tuple:
    """(Generate, Compare, Stop) as they should be: one run at a time per page, so the buttons that start one are
    off while one runs, and Stop is on only then."""
    return gr.update(interactive=not running), gr.update(interactive=not running), gr.update(interactive=running)


def submit_live(session: Session) -> tuple:
    """run.submit, for Generate: and the live figures' timer on and the buttons set for a run, in the same event
    (one event fewer at the start of a run, each a few milliseconds of the browser's script that the engine's
    cores pay for)."""
    submit(session)
    return gr.Timer(active=True), *buttons(True)


def submit_compare(session: Session) -> tuple:
    """run.submit, for Compare, and the buttons set for a run."""
    submit(session)
    return buttons(True)


def live_off() -> tuple:
    """After a run: the live figures' timer off and the buttons back."""
    return gr.Timer(active=False), *buttons(False)
