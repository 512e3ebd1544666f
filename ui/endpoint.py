"""The endpoint backend on the page: which endpoints a run may use, the key, and the run itself (streamed like
ours, through the same pump, stats, records and exports).

An endpoint run never takes the engine's lock: a slow or stalled server holds up only the tab that asked for it.
Only the endpoints given at launch (--endpoint) can be picked, unless the app was started with
--allow-any-endpoint: a public Space must not fetch any address a visitor types (SSRF). The key lives in the
session (from the password field) or in the launch environment (--api-key-env), never in the settings, so it
reaches no CSV, trace, table or message.
"""
from __future__ import annotations

import gradio as gr

from engine.endpoint import (Endpoint, EndpointError, EndpointStream, check_url, endpoint_stats, extra_summary,
                             format_extra)
from engine.request import SPECS, Request
from engine.stats import Round
from ui import render
from ui.pump import DONE, RoundPump
from ui.run import LiveRun, begin_run, record_run, refusal
from ui.runtime import Runtime

ENGINE, ENDPOINT = "engine", "endpoint"  # Request.backend's values
BACKENDS = (("this engine", ENGINE), ("endpoint", ENDPOINT))  # the Backend radio: (shown, value)
CONCURRENT_RUNS = 4  # endpoint runs at once: each holds a connection and a reader thread, not the engine


def allowed(rt: Runtime, url: str) -> str | None:
    """url as the launch list spells it, when it is one of the endpoints named at launch; else None."""
    try:
        url = check_url(url)
    except ValueError:
        return None
    return url if url in {check_url(u) for u in rt.endpoints} else None


def check(rt: Runtime, s: Request) -> None:
    """ValueError naming the setting at fault; the key is not looked at here."""
    if not s.endpoint:
        raise ValueError("no endpoint is chosen: pick one" + ("" if rt.endpoints or rt.allow_any_endpoint else
                                                              " (start the app with --endpoint URL)"))
    if allowed(rt, s.endpoint) is None and not rt.allow_any_endpoint:
        listed = ", ".join(rt.endpoints) or "none"
        raise ValueError(f"that endpoint is not one the app was started with; pick one of the list ({listed}); an "
                         "address of your own needs the app started with --allow-any-endpoint")
    Endpoint(s.endpoint, model=s.endpoint_model, server=s.server)  # raises naming the URL or server


def endpoint_of(rt: Runtime, s: Request, session) -> Endpoint:
    """The run's endpoint with its key: the tab's own key, else the launch key, and the launch key only for an
    endpoint named at launch (a typed address, allowed by --allow-any-endpoint, gets the tab's key or none)."""
    url = allowed(rt, s.endpoint)
    key = getattr(session, "api_key", None) or (rt.endpoint_key if url is not None else None)
    return Endpoint(url or s.endpoint, model=s.endpoint_model, server=s.server, api_key=key or None,
                    stall_s=rt.endpoint_stall_s)


def is_endpoint(backend) -> bool:
    return backend in (ENDPOINT, "endpoint")


def gate(on_endpoint: bool):
    """The first step of Generate's chain for one backend (ui/layout.py): the other backend's chain stops here,
    silently, before it waits in a queue."""
    def check_backend(backend):
        if is_endpoint(backend) != on_endpoint:
            raise gr.Error("the other backend's queue runs this", visible=False, print_exception=False)
    return check_backend


def queued(generate, on_endpoint: bool):
    """generate for one queue: an API call that names the other backend is refused, naming the right route."""
    def run(session, prompt, **values):
        if is_endpoint(values.get("backend") or ENGINE) != on_endpoint:
            route = "/generate_endpoint" if not on_endpoint else "/generate"
            raise refusal(f"{'an endpoint' if not on_endpoint else 'an engine'} run goes through {route} (endpoint "
                          "runs wait in a queue of their own)")
        yield from generate(session, prompt, **values)
    return run


def set_key(session, key: str) -> None:
    """The password field's change: kept in the session (this tab's server-side state) only."""
    session.api_key = (key or "").strip() or None


class EndpointPump(RoundPump):
    """RoundPump's queue and batching over an endpoint stream, without the engine's lock; Stop or a closed tab
    closes the connection within the client's poll."""

    def __init__(self, rt: Runtime, s: Request, prompt: str, session):
        p = s.sampling
        self.run = EndpointStream(endpoint_of(rt, s, session), prompt, chat=s.chat, max_new_tokens=s.max_new_tokens,
                                  temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=p.seed,
                                  tokenizer=rt.tokenizer, cancelled=lambda: self.stop.is_set() or self.closed.is_set())
        super().__init__(rt, s, [], session.run_stop)

    def _run(self) -> None:
        try:
            for rnd in self.run:
                self.arrived.append(rnd)
                self.q.put(rnd)
        except Exception as e:  # handed to the page's generator, which says what happened
            self.q.put(e)
        finally:
            self.q.put(DONE)


def run_rounds(pump: EndpointPump, interval_s: float):
    """pump.batches, with an endpoint failure returned (its rounds so far kept) instead of raised."""
    try:
        for batch in pump.batches(interval_s):
            yield batch, None
    except EndpointError as e:
        yield [], e


def stats_of(rt: Runtime, rounds: list[Round], pump: EndpointPump, settings: dict, prompt_len: int):
    info = pump.run.info  # the model column names the served model, not ours
    return endpoint_stats(rounds, info, {**settings, "model": info.endpoint_model or settings.get("model")},
                          prompt_len)


def generate(rt: Runtime, session, prompt: str, s: Request, ids: list[int]):
    """callbacks.generate for an endpoint run: yields (tokens html, stats html, status html)."""
    session.last = None
    if not begin_run(session):
        yield (gr.skip(), gr.skip(), render.message_html("Stopped before it started."))
        return
    settings = s.as_dict(rt.model_name)
    html, rounds, failed = "", [], None
    yield (html, render.stats_line(None, running=True), render.message_html(f"Running {s.label()}."))
    try:
        pump = EndpointPump(rt, s, prompt, session)
    except ValueError as e:  # said where the output goes, the last run's figures cleared (as for ours)
        yield (render.error_html(str(e), "Run refused"), "", "")
        raise refusal(str(e)) from None
    session.live = LiveRun(rounds, len(ids), settings, [])
    try:
        for batch, err in run_rounds(pump, rt.stream_interval_s):
            failed = err or failed
            rounds += batch
            html += render.render_rounds(batch, rt.text_of)
            yield (html, render.stats_line(stats_of(rt, rounds, pump, settings, len(ids)), running=True), gr.skip())
    finally:
        pump.close()
        session.live = None
    stats = stats_of(rt, rounds, pump, settings, len(ids))
    html = render.render_rounds(rounds, rt.text_of)  # kinds a server reports only at the end (vLLM) are in now
    n = len(session.history) + 1
    note = format_extra(extra_summary(stats, pump.run.info)) if rounds else ""
    if failed is not None:
        label, msg = f"{s.label()} (failed)", f"Run {n} failed: {failed}"
    elif pump.run.stopped or not (rounds and rounds[-1].finished):
        label, msg = s.label(), f"Run {n} stopped after {len(stats.ids)} tokens."
    else:
        label, msg = s.label(), f"Run {n} done: {s.label()}."
    if not rounds and failed is not None:
        yield (render.error_html(str(failed), "Run failed"), "", "")
        raise refusal(str(failed))
    files = record_run(rt, session, stats, label, failed is not None or pump.run.stopped)
    session.last = (stats, files)
    yield (html, render.stats_line(stats), render.message_html(msg + (f"\n{note}" if note else "")))


def run_to_end(rt: Runtime, session, s: Request, prompt: str, status: str):
    """compare.run_to_end for the endpoint: its Stats, or None if it was stopped; a failure is named."""
    pump = EndpointPump(rt, s, prompt, session)
    rounds: list[Round] = []
    try:
        for batch, err in run_rounds(pump, 0.25):
            if err is not None:
                raise gr.Error(f"Compare: the endpoint run failed: {err}", print_exception=False)
            rounds += batch
            yield status
    finally:
        pump.close()
    if pump.run.stopped or not (rounds and rounds[-1].finished):
        return None
    return stats_of(rt, rounds, pump, s.as_dict(rt.model_name), 0)


def plan(rt: Runtime, s: Request, positions: int | None = None) -> list:
    """Compare with an endpoint chosen: this engine and the endpoint, same prompt and settings, one bar each."""
    from dataclasses import replace

    ours = replace(s, backend="engine", weights=s.weights or rt.weight_format)
    return [("backend", f"this engine ({ours.mode_label()})", ours, None, True),
            ("backend", f"endpoint {s.endpoint}", s, None, False)]


def visibility(backend: str):
    return gr.update(visible=backend == ENDPOINT)


def widgets(rt: Runtime):
    """The backend choice and the endpoint's fields (shown when it is picked): (backend, the fields' group, URL,
    model, server, key). The URL box takes typed addresses only with --allow-any-endpoint."""
    from engine.endpoint import SERVER_CHOICES

    usable = bool(rt.endpoints) or rt.allow_any_endpoint
    backend = gr.Radio(list(BACKENDS), value=ENGINE, label=SPECS["backend"].label, elem_id="backend",
                       interactive=usable,
                       info="this engine, or a serving engine's OpenAI-compatible endpoint (vLLM, SGLang, "
                            "llama-server): the same panels for its stream" if usable else
                            "start the app with --endpoint URL to profile a serving engine")
    with gr.Group(visible=False, elem_id="endpoint-fields") as box:
        url = gr.Dropdown(rt.endpoints, value=rt.endpoints[0] if rt.endpoints else None, label=SPECS["endpoint"].label,
                          elem_id="endpoint-url", allow_custom_value=rt.allow_any_endpoint,
                          info="the API's base URL" + (" (or type one)" if rt.allow_any_endpoint else ""))
        with gr.Row():
            model = gr.Textbox("", label=SPECS["endpoint_model"].label, elem_id="endpoint-model",
                               placeholder="the first it serves")
            server = gr.Dropdown(list(SERVER_CHOICES), value=SPECS["server"].default, label=SPECS["server"].label,
                                 elem_id="endpoint-server",
                                 info="for its own fields; auto asks it")
        key = gr.Textbox("", label="API key", type="password", elem_id="endpoint-key",
                         placeholder="set at launch" if rt.endpoint_key else "none",
                         info="kept in this tab's session only; never in a table, file or message")
    return backend, box, url, model, server, key
