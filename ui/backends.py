"""Which backend runs a request, this engine (ui/local.py) or a serving engine's endpoint (ui/endpoint.py): the
one place the choice is made. Each backend checks a request, streams a Generate run, runs a Compare
configuration to its end and plans a Compare; the handlers (callbacks, compare) ask `of(s)` and never look at
the backend themselves.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from engine.request import Request
from ui import endpoint, local
from ui.run import parse_settings, refusal
from ui.runtime import Runtime


@dataclass(frozen=True)
class Backend:
    check: Callable  # (rt, s, ids): ValueError naming the setting to change
    generate: Callable  # (rt, session, prompt, s, ids): the page's updates of a Generate run
    run_to_end: Callable  # (rt, session, s, ids, status, prompt): a generator returning Stats, or None if stopped
    plan: Callable  # (rt, s): Compare's configurations (ui/compare.py)


ENGINE = Backend(local.check, local.generate, local.run_to_end, local.plan)
ENDPOINT = Backend(lambda rt, s, ids: endpoint.check(rt, s), endpoint.generate,
                   lambda rt, session, s, ids, status, prompt: endpoint.run_to_end(rt, session, s, prompt, status),
                   endpoint.plan)


def of(s: Request) -> Backend:
    return ENDPOINT if s.on_endpoint else ENGINE


def prepare(rt: Runtime, prompt: str, values: dict) -> tuple[Request, list[int]]:
    """Settings and prompt ids, checked by the backend that will run them, or gr.Error saying what to change;
    nothing has touched the engine yet."""
    if not prompt or not prompt.strip():
        raise refusal("The prompt is empty: type something or pick an example.")
    try:
        s = parse_settings(values)
        if not s.on_endpoint:  # the weights named: the label and the CSVs say which
            s = replace(s, weights=s.weights or rt.weight_format)
        ids = rt.encode(prompt, s.chat)
        of(s).check(rt, s, ids)
    except ValueError as e:
        raise refusal(str(e)) from None
    return s, ids
