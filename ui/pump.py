"""The pump: runs the engine side of a run (Runtime.rounds_fn) on its own thread while the page is fed."""
from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Iterator

import torch

from engine.stats import Round
from engine.request import Request
from engine.speculative import SessionIndex
from ui.runtime import RunFacts, Runtime

DONE = object()  # the end of a pump's queue (an EndpointPump's too)
IDLE_POLL_S = 0.5  # an idle generator still yields this often, so gradio can close it


class RoundPump:
    """Runs a round generator on its own thread, so the engine never waits while the page is fed.

    The thread holds the runtime's lock for the whole run: one run on the engine at a time, and a
    stopped run frees the engine after the round in flight. The engine side yields Round records and
    RunFacts; batches() hands on the rounds, the facts collect in `facts`, and `arrived` holds every round
    the moment it arrives (the page's token stream reads it, ui/stream.py)."""

    def __init__(self, rt: Runtime, s: Request, prompt_ids: list[int], stop: threading.Event,
                 earlier: SessionIndex | None = None):
        self.rt, self.s, self.prompt_ids, self.stop, self.earlier = rt, s, prompt_ids, stop, earlier
        self.facts: list[RunFacts] = []
        self.arrived: list[Round] = []  # appended here only; readers take a slice (a list append is atomic)
        self.closed = threading.Event()  # the page's generator went away (closed tab, cancelled event)
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        ctx = contextvars.copy_context()  # spaces.GPU reads the gradio request from context
        self.thread = threading.Thread(target=ctx.run, args=(self._run,), name="decodescope-run", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.rt.lock, torch.inference_mode():
            items = self.rt.rounds_fn(self.s, self.prompt_ids, self.earlier)
            try:
                for item in items:
                    if isinstance(item, RunFacts):
                        self.facts.append(item)
                        continue
                    self.arrived.append(item)
                    self.q.put(item)
                    if self.stop.is_set() or self.closed.is_set():
                        break
            except Exception as e:  # handed to the page's generator, which re-raises it there
                self.q.put(e)
            finally:
                items.close()
                self.q.put(DONE)

    def batches(self, interval_s: float) -> Iterator[list[Round]]:
        """The rounds that arrived, at most one list per interval (the first round goes out at once).

        An empty list means nothing arrived for a while; errors from the engine are re-raised here."""
        batch: list[Round] = []
        last = time.monotonic() - interval_s
        while True:
            now = time.monotonic()
            if batch and now >= last + interval_s:
                yield batch
                batch, last = [], now
                continue
            try:
                item = self.q.get(timeout=last + interval_s - now if batch else IDLE_POLL_S)
            except queue.Empty:
                if not batch:
                    yield batch
                continue
            if item is DONE:
                if batch:
                    yield batch
                return
            if isinstance(item, Exception):
                raise item
            batch.append(item)

    def close(self) -> None:
        """Ask the run to end after its round in flight. No join: this may run on gradio's event loop,
        and the lock already keeps the next run off the engine until this one has let go."""
        self.closed.set()
