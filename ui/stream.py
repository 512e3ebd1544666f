"""The token stream's side channel: while a run streams, the page fetches its new spans itself.

Why not gradio's own streaming: every update of a streaming event makes the browser re-snapshot the props of
every component that has ever had a loading status (the figures and tables of earlier runs included) and
run its status trackers, several milliseconds of script an update on a small CPU that the engine shares; at
15 updates a second that was the page's largest cost after rendering. So the streaming event yields only a
marker naming the run (and the stats line twice a second), and the output box's script (page_js.OUTPUT_JS)
asks `poll` for the spans of the rounds that arrived since its last call, ~15 times a second: a plain request
that touches no gradio state. The run's final update carries the whole HTML (what API clients receive), of
which the page already shows every span.

A run is named by an unguessable token that only the page which started it is given, so a page reads no
other run's tokens.
"""
from __future__ import annotations

import uuid

from ui import render
from ui.pump import RoundPump
from ui.runtime import Runtime

MARKER = "<!--ds-live:{}-->"  # the output's value while a run streams: the page polls for that run


def open_stream(rt: Runtime, pump: RoundPump) -> str:
    """Register the pump's rounds under a fresh token; returns the output value that names it."""
    token = uuid.uuid4().hex
    rt.streams[token] = pump
    return MARKER.format(token)


def close_stream(rt: Runtime, marker: str) -> None:
    rt.streams.pop(marker.removeprefix("<!--ds-live:").removesuffix("-->"), None)


def poll(rt: Runtime, token: str, offset: int) -> dict:
    """The spans of the rounds after the first `offset` (html), the new offset, and whether the run is gone."""
    pump = rt.streams.get(str(token))
    if pump is None:
        return dict(html="", offset=offset, done=True)
    offset = max(0, int(offset))
    rounds = pump.arrived[offset:]
    run = pump.rt  # the run's model: its tokenizer names the tokens
    return dict(html=render.render_rounds(rounds, run.text_of, run.special_ids), offset=offset + len(rounds),
                done=False)
