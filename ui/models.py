"""The models a launch offers on the page: the first built at launch, each other one on its first pick.

Each model has its own Runtime (engine, tokenizer, drafts, weight formats); they share what belongs to the app
rather than to a model: the export store and the stream registry (a session's files and a page's stream do not
depend on which model ran), the endpoint options, and the engine lock: one run on the machine at a time,
whichever model, since two runs would share the cores and each one's timings would be wrong.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from ui.runtime import Runtime

SHARED = ("store", "lock", "endpoints", "allow_any_endpoint", "endpoint_key", "endpoint_stall_s",
          "stream_interval_s", "plot_interval_s")


class Runtimes:
    """Model title (what the page's picker shows and Request.model holds) -> its Runtime, built once.

    `later` maps each other title to (a note on what its first load does, a function building its Runtime, called
    with shared=the shared fields). Building holds a lock of its own: two users picking the same model at once
    load it once, and a model that fails to load is built again on its next pick, the others serving meanwhile."""

    def __init__(self, first: Runtime, later: dict[str, tuple[str, Callable[[dict], Runtime]]] | None = None):
        self.first = first
        self.later = dict(later or {})
        self.built: dict[str, Runtime] = {first.model_name: first}
        self._building = threading.Lock()

    @property
    def titles(self) -> list[str]:
        return [self.first.model_name, *(t for t in self.later if t != self.first.model_name)]

    def check(self, title: str) -> str:
        """The title a run names ("" is the first model), or ValueError naming the choices."""
        title = title or self.first.model_name
        if title not in self.titles:
            raise ValueError(f"model {title!r} is not one this app offers; pick one of {', '.join(self.titles)}")
        return title

    def is_built(self, title: str) -> bool:
        return self.check(title) in self.built

    def loading_note(self, title: str) -> str:
        """What the first pick of `title` is about to do (shown before it starts)."""
        title = self.check(title)
        return f"Loading {title} (first use: {self.later[title][0]})."

    def get(self, title: str) -> Runtime:
        """The model's Runtime, built on first use. A failed build raises ValueError saying which model and why."""
        title = self.check(title)
        if (rt := self.built.get(title)) is not None:
            return rt
        with self._building:
            if title not in self.built:
                _, build = self.later[title]
                shared = {name: getattr(self.first, name) for name in SHARED}
                try:
                    self.built[title] = build(shared=shared)
                except (ValueError, OSError, RuntimeError) as e:  # a load's failures: bad file, no room, torch
                    raise ValueError(f"{title} could not load ({e}); {self.first.model_name} still serves: "
                                     "pick it, or restart the app once the cause is fixed") from None
        return self.built[title]

    def close(self) -> None:
        for rt in list(self.built.values()):
            rt.close()
