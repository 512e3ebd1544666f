"""The token stream's side channel: while a run streams, the page fetches its new spans and its stats line itself.

Why not gradio's own streaming: every update of a streaming event makes the browser re-snapshot the props of
every component that has ever had a loading status (the figures and tables of earlier runs included) and
run its status trackers, several milliseconds of script an update on a small CPU that the engine shares; at
15 updates a second that was the page's largest cost after rendering, and at two a second (the stats line)
still ~40 ms of the browser's script each (gradio's dispatch re-derives every component's loading status,
measured in a Chromium trace). So the streaming event yields the marker naming the run and, while the run goes
on, only updates that change nothing (gradio closes a run whose page went away at a yield), and the output
box's script (page_js.OUTPUT_JS) asks `poll` for the spans of the rounds that arrived since its last call and
for the stats line of the run so far, ~15 times a second: a plain GET of the app's own route (ROUTE, not a
gradio server function, whose client-side machinery cost the page as much script again), that touches no
gradio state. The run's final update carries the whole HTML and the final stats line (what API clients
receive), of which the page already shows every span.

A run is named by an unguessable token that only the page which started it is given, so a page reads no
other run's tokens.
"""
from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from fastapi.routing import APIRoute

from ui import render
from ui.pump import RoundPump

MARKER = "<!--ds-live:{}-->"  # the output's value while a run streams: the page polls for that run
ROUTE = "/ds/poll"  # ?token=...&offset=...: the app's own route (layout.launch_kwargs adds it)
STATS_INTERVAL_S = 0.5  # how often a poll's answer carries the stats line (it costs the engine's process a summary)


@dataclass
class LiveStream:
    pump: RoundPump
    stats_line: Callable[[], str]  # the stats line of the run so far
    stats_at: float = -math.inf  # when a poll last carried it (time.monotonic)


LIVE: dict[str, LiveStream] = {}  # token -> the run it names, for as long as it streams (one registry a process)


def open_stream(pump: RoundPump, stats_line: Callable[[], str]) -> str:
    """Register the pump's rounds under a fresh token; returns the output value that names it."""
    token = uuid.uuid4().hex
    LIVE[token] = LiveStream(pump, stats_line)
    return MARKER.format(token)


def close_stream(marker: str) -> None:
    LIVE.pop(marker.removeprefix("<!--ds-live:").removesuffix("-->"), None)


def poll(token: str, offset: int) -> dict:
    """The spans of the rounds after the first `offset` (html), the new offset, whether the run is gone, and
    the stats line of the run so far (stats; "" when it is less than STATS_INTERVAL_S since the last)."""
    live = LIVE.get(str(token))
    if live is None:
        return dict(html="", offset=offset, done=True, stats="")
    offset = max(0, int(offset))
    rounds = live.pump.arrived[offset:]
    run = live.pump.rt  # the run's model: its tokenizer names the tokens
    stats, now = "", time.monotonic()
    if now - live.stats_at >= STATS_INTERVAL_S:
        stats, live.stats_at = live.stats_line(), now
    return dict(html=render.render_rounds(rounds, run.text_of, run.special_ids), offset=offset + len(rounds),
                done=False, stats=stats)


def route() -> APIRoute:
    """GET ROUTE?token=&offset=: poll's answer as JSON (a bad offset reads as 0)."""
    def endpoint(token: str = "", offset: str = "0") -> dict:
        return poll(token, int(offset) if offset.isdigit() else 0)

    return APIRoute(ROUTE, endpoint, methods=["GET"], name="decodescope-poll")
