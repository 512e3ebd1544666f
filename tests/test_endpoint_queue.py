"""Endpoint runs through gradio's own queue, as remote users reach them: they wait apart from the engine's runs
(a stalled server holds no engine run) with their own bounded concurrency (two endpoint runs overlap), Stop ends
one at once, and /last_run after a refused run gives empty figures instead of failing in the client."""
from __future__ import annotations

import time

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from ui import endpoint, layout
from ui.models import Runtimes
from ui.startup import build_runtime
from ui.testing import tiny_settings
from tests.endpoint_fake import FakeServer, chunk, stall_after
from runtimes import QUIET


@pytest.fixture(scope="module")
def served():
    rt = build_runtime(tiny=True, **QUIET)
    demo = layout.build(Runtimes(rt))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    yield rt, demo.local_url
    demo.close()
    rt.close()


def endpoint_values(url):
    return tiny_settings(backend="endpoint", endpoint=url, endpoint_model="m", server="openai", max_new_tokens=8)


def test_a_stalled_endpoint_holds_neither_the_engine_nor_other_endpoint_runs(served):
    rt, app = served
    holder = []
    with FakeServer(stall_after([chunk("a")], holder)) as fake:
        holder.append(fake)
        rt.endpoints, rt.endpoint_stall_s = [fake.url], 30.0
        first, second, engine_user = (Client(app, verbose=False) for _ in range(3))
        a = first.submit("hi", **endpoint_values(fake.url), api_name="/generate_endpoint")
        b = second.submit("hi", **endpoint_values(fake.url), api_name="/generate_endpoint")
        t = time.monotonic()
        while len(fake.requests) < 2 and time.monotonic() - t < 20:
            time.sleep(0.05)
        assert len(fake.requests) == 2, "the second endpoint run waited for the first"
        t = time.monotonic()
        engine_user.predict("the cat", **tiny_settings(max_new_tokens=4), api_name="/generate")
        assert time.monotonic() - t < 60 and not a.done(), "an engine run waited on a stalled endpoint"
        first.predict(api_name="/stop")
        t = time.monotonic()
        out = a.result(timeout=10)
        assert time.monotonic() - t < 3 and "stopped" in out[2]
        second.predict(api_name="/stop")
        b.result(timeout=10)
        assert fake.client_left.wait(3)


def test_each_queue_refuses_the_other_backends_runs(served):
    rt, app = served
    c = Client(app, verbose=False)
    rt.endpoints = ["http://127.0.0.1:9/v1"]
    with pytest.raises(AppError, match="goes through /generate_endpoint"):
        c.predict("hi", **endpoint_values(rt.endpoints[0]), api_name="/generate")
    with pytest.raises(AppError, match="goes through /generate"):
        c.predict("hi", **tiny_settings(max_new_tokens=2), api_name="/generate_endpoint")


def test_last_run_after_a_refused_run_gives_empty_figures(served):
    rt, app = served
    c = Client(app, verbose=False)
    rt.endpoints = ["http://127.0.0.1:9/v1"]
    with pytest.raises(AppError, match="not one the app was started with"):
        c.predict("hi", **endpoint_values("http://127.0.0.1:11/v1"), api_name="/generate_endpoint")
    out = c.predict(api_name="/last_run")
    assert len(out) == 7 and out[4] is None
    assert endpoint.CONCURRENT_RUNS >= 2


def test_the_runs_table_shows_its_cells_as_text(served):
    """A server's model name lands in the runs table: gradio's Dataframe renders a cell as HTML or Markdown only
    for those datatypes (its Svelte cell sets a text node otherwise), so the table must use neither."""
    import httpx

    _, app = served
    config = httpx.get(app.rstrip("/") + "/config", trust_env=False, timeout=10).json()
    (runs,) = [c for c in config["components"] if c.get("props", {}).get("elem_id") == "runs"]
    datatype = runs["props"].get("datatype")
    kinds = [datatype] if isinstance(datatype, str) else list(datatype or [])
    assert kinds and not {"html", "markdown"} & set(kinds), kinds
