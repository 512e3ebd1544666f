"""The app served in-process and driven through gradio_client, as a remote user would."""
import json
import threading
import time

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import Status

from engine.request import NAMES
from ui.models import Runtimes
from ui import app
from ui import layout
from ui.startup import build_runtime
from ui.testing import tiny_settings
from runtimes import QUIET, read_csv

MAX_NEW_TOKENS = 16
PROMPT = "one two three, one two three, one two"


def values(**overrides):
    return tiny_settings(**{"max_new_tokens": MAX_NEW_TOKENS, **overrides})


def serve(rt):
    demo = layout.build(Runtimes(rt))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    return demo


@pytest.fixture(scope="module")
def served():
    rt = build_runtime(tiny=True, **QUIET)
    demo = serve(rt)
    yield rt, demo.local_url
    demo.close()
    rt.close()


def client(url):
    return Client(url, verbose=False, download_files=True)


def generate(c, prompt=PROMPT, **overrides):
    """/generate streams (tokens, stats, status); /last_run then gives figures, run table and files."""
    return (*c.predict(prompt, **values(**overrides), api_name="/generate"), *c.predict(api_name="/last_run"))


def test_parse_args_defaults_and_flags():
    a = app.parse_args([])
    assert (a.model, a.device, a.max_seq_len, a.tiny, a.allow_any_model) == (None, "auto", 2048, False, False)
    a = app.parse_args(["--tiny", "--draft", "x", "--draft", "y", "--port", "9000"])
    assert a.draft == ["x", "y"] and a.port == 9000 and a.tiny
    assert app.parse_args(["--model", "gemma3-270m", "--model", "default"]).model == ["gemma3-270m", "default"]


def test_the_default_launch_builds_smollm2_and_offers_gemma_on_first_pick(monkeypatch):
    """Only the first model loads at start (the Space starts as fast as with one); the picker offers both."""
    from ui import startup

    built = []

    def fake_build(name, drafts=(), **kw):
        built.append((name, list(drafts), kw.get("shared")))
        rt = build_runtime(tiny=True, **QUIET)
        rt.model_name = startup.title(name)
        return rt

    monkeypatch.setattr(startup, "build_runtime", fake_build)
    models = app.build_models(app.parse_args(["--draft", "d", "--allow-any-model", "--no-example-check"]))
    try:
        assert built == [("default", ["d"], None)]
        assert models.titles == ["SmolLM2-135M-Instruct (embedded)", "Gemma 3 270M (embedded)"]
        assert not models.is_built("Gemma 3 270M (embedded)")
        models.get("Gemma 3 270M (embedded)")
        name, drafts, shared = built[1]
        assert (name, drafts) == ("gemma3-270m", []) and shared["store"] is models.first.store
        tiny = app.build_models(app.parse_args(["--tiny"]))
        assert len(tiny.titles) == 1  # --tiny: one model, no picker
        tiny.close()
    finally:
        models.close()


def test_models_outside_the_launch_list_need_the_flag():
    from ui.startup import check_allowed

    check_allowed(["default", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"], allow_any=False)
    with pytest.raises(SystemExit, match="--allow-any-model"):
        check_allowed(["/etc/secret-model"], allow_any=False)
    check_allowed(["/some/folder"], allow_any=True)


def test_api_exposes_only_the_user_actions(served):
    _, url = served
    names = set(client(url).view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/generate", "/last_run", "/compare", "/last_compare", "/stop"} <= names
    assert not names & {"/submit", "/setting_visibility"}


def test_the_api_takes_the_request_settings_by_name(served):
    # the parameter names are the record's, each with the page's starting value as its default, so a client
    # that names only what it changes keeps working when a setting is added
    _, url = served
    c = client(url)
    params = c.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    assert [p["parameter_name"] for p in params] == ["prompt", *NAMES]
    assert all(p["parameter_has_default"] for p in params if p["parameter_name"] in ("k", "temperature", "mode"))
    html, stats, status = c.predict(PROMPT, max_new_tokens=3, chat=False, fused_kernels=False, cuda_graphs=False,
                                    api_name="/generate")
    assert "done" in status and html.count('class="tok ') == 3


@pytest.mark.parametrize("mode", ["plain", "n-gram", "draft model", "layer-skip"])
def test_every_mode(served, mode):
    _, url = served
    html, stats, status, *_figs, table, tokens_csv, trace, runs_csv = generate(client(url), mode=mode)
    assert "done" in status and 'class="tok tok-' in html
    rows = read_csv(tokens_csv)
    assert {r["mode"] for r in rows} == {mode} and len(rows) == html.count('class="tok ')
    assert table["data"][0][1].startswith(mode)


def test_four_clients_at_once_each_get_their_own_run(served):
    _, url = served
    results, errors = {}, []

    def one(i):
        try:
            results[i] = generate(client(url), mode=["plain", "n-gram", "draft model", "layer-skip"][i],
                                  max_new_tokens=10 + 4 * i, seed=i)
        except Exception as e:  # reported below with the client's index
            errors.append((i, e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    assert not errors and len(results) == 4
    run_ids = set()
    for i, out in results.items():
        rows = read_csv(out[7])
        emitted = [r for r in rows if r["kind"] != "rejected"]
        assert {r["max_new_tokens"] for r in rows} == {str(10 + 4 * i)}
        assert len(emitted) <= 10 + 4 * i
        assert len(out[6]["data"]) == 1  # each session sees its own history only
        run_ids |= {r["run_id"] for r in rows}
    assert len(run_ids) == 4


def wait_iterating(job, timeout=30):
    t0 = time.monotonic()
    while job.status().code != Status.ITERATING:
        assert time.monotonic() - t0 < timeout, job.status()
        time.sleep(0.02)


def test_cancelled_run_then_a_good_one(served):
    rt, url = served
    c = client(url)
    job = c.submit(PROMPT, **values(max_new_tokens=1900), api_name="/generate")
    wait_iterating(job)
    job.cancel()
    assert rt.lock.acquire(timeout=5)  # the engine let go within a round
    rt.lock.release()
    out = generate(c)
    assert "done" in out[2]


def test_stop_endpoint_ends_the_run_and_keeps_what_it_made(served):
    _, url = served
    c = client(url)
    job = c.submit(PROMPT, **values(max_new_tokens=1900), api_name="/generate")
    wait_iterating(job)
    c.predict(api_name="/stop")
    out = (*job.result(timeout=10), *c.predict(api_name="/last_run"))
    assert "stopped after" in out[2]
    assert out[6]["data"][-1][-1] == "yes"
    assert len(read_csv(out[7])) < 1900


@pytest.mark.parametrize("overrides,needle", [
    (dict(mode="n-gram", k=40), "k=40"),
    (dict(temperature=-0.5), "temperature=-0.5"),
    (dict(top_p=0), "top_p=0"),
    (dict(top_p=1.2), "top_p=1.2"),
    (dict(max_new_tokens=4000), "lower max new tokens"),
    (dict(temperature=5), "temperature=5 is out of range; pick 0..2"),  # past the slider, the same range
    (dict(max_new_tokens=0), "max_new_tokens=0 is out of range; pick 1 or more"),
])
def test_bad_settings_are_errors_and_the_app_keeps_serving(served, overrides, needle):
    _, url = served
    c = client(url)
    with pytest.raises(AppError, match=needle.replace("(", r"\(")):
        generate(c, **overrides)
    assert "done" in generate(c)[2]


def test_prompt_longer_than_the_cache_through_the_client(served):
    _, url = served
    with pytest.raises(AppError, match="shorten the prompt"):
        generate(client(url), prompt="word " * 2100)


def test_compare(served):
    rt, url = served
    c = client(url)
    status = c.predict(PROMPT, **values(mode="n-gram"), api_name="/compare")
    fig, table, runs, runs_csv = c.predict(api_name="/last_compare")
    assert "Compared" in status
    notes = {row[1]: row[-1] for row in table["data"]}
    assert notes["CUDA graph"] == rt.graphs_reason
    groups = {row[0] for row in table["data"]}
    assert {"CUDA graphs", "kernels", "weights", "attention", "speculative"} <= groups
    assert {"fp32 weights", "fp16 weights", "int8 weights", "q4 weights", "window 512 + 4 sinks"} <= set(notes)
    # the short prompt fits in the window, so it is named, not timed
    assert notes["window 512 + 4 sinks"].startswith("same as full attention at this context")
    # plain (also fp32 weights and full attention), fp16, int8, q4, n-gram; fused too where it runs
    ran = 5 + (rt.fused_reason is None)
    assert len(read_csv(runs_csv)) == len(runs["data"]) == ran


@pytest.mark.slow
def test_default_model_streams_real_text(default_model_dir):
    rt = build_runtime("default", device="cpu", bandwidth=False, progress=lambda *a: None)
    demo = serve(rt)
    try:
        c = client(demo.local_url)
        out = generate(c, prompt="Name three colours.", chat=True, max_new_tokens=12, draft_model=None)
        rows = read_csv(out[7])
        text = "".join(r["token_text"] for r in rows)
        assert "done" in out[2] and len(rows) >= 2 and text.strip()
        out = generate(c, prompt="Repeat exactly: the quick brown fox jumps over the lazy dog.", chat=True,
                       mode="n-gram", max_new_tokens=16, draft_model=None)
        assert "acceptance" in out[1]
    finally:
        demo.close()
        rt.close()


def test_page_config_carries_no_runtime():
    """gradio deep-copies the page config on every page load: a runtime in it would copy the model."""
    rt = build_runtime(tiny=True, **QUIET)
    found = []

    def walk(o, path):
        if isinstance(o, dict):
            [walk(v, path + [k]) for k, v in o.items()]
        elif isinstance(o, (list, tuple)):
            [walk(v, path + [i]) for i, v in enumerate(o)]
        elif not isinstance(o, (str, int, float, bool, type(None))) and not callable(o) or hasattr(o, "args"):
            found.append((path, type(o)))

    walk(layout.build(Runtimes(rt)).get_config_file(), [])
    assert not found
    rt.close()


def test_profile_endpoint(served):
    rt, url = served
    status, fig, table, profile_csv, trace = client(url).predict(PROMPT, "kernels", 3, **values(), api_name="/profile")
    assert "Profiled in" in status
    if rt.fused_reason:  # the second configuration is listed with its reason
        assert [row[1] for row in table["data"]] == ["decode", "verify", None]
        assert table["data"][-1][-1] == f"fused kernels unavailable: {rt.fused_reason}"
    else:  # both ran: the page's fused kernels and the torch twins
        assert [row[1] for row in table["data"]] == ["decode", "verify"] * 2
        assert {row[0].split(" · ")[1] for row in table["data"]} == {"fused", "torch"}
    rows = read_csv(profile_csv)
    assert {r["op_class"] for r in rows} >= {"matmul", "attention", "norm", "kv_write", "sampling", "host"}
    with open(trace, encoding="utf-8") as f:
        assert json.load(f)["traceEvents"]


def test_the_page_poll_route_serves_a_live_run_and_nothing_else(served):
    """The output box's fetch (ui/stream.py ROUTE): a plain GET beside gradio's routes, that answers for a
    run it was given the token of, and says `done` for any other."""
    import threading

    import httpx

    from ui import stream
    from ui.pump import RoundPump
    from engine.request import Request

    rt, url = served
    base = url.rstrip("/") + stream.ROUTE
    assert httpx.get(base, params={"token": "0" * 32, "offset": "x"}).json() == dict(html="", offset=0, done=True,
                                                                                      stats="")
    pump = RoundPump(rt, Request(max_new_tokens=8, chat=False), rt.tokenizer.encode(PROMPT), threading.Event())
    marker = stream.open_stream(pump, lambda: "the stats line")
    token = marker.removeprefix("<!--ds-live:").removesuffix("-->")
    try:
        pump.thread.join(60)
        reply = httpx.get(base, params={"token": token, "offset": 0}).json()
        assert not reply["done"] and reply["offset"] == len(pump.arrived) > 0
        assert reply["html"].count('class="tok ') == sum(len(r.tokens) for r in pump.arrived)
        assert reply["stats"] == "the stats line"
        again = httpx.get(base, params={"token": token, "offset": reply["offset"]}).json()
        assert again["html"] == "" and again["stats"] == ""  # nothing new, and the stats line only twice a second
    finally:
        stream.close_stream(marker)
    assert httpx.get(base, params={"token": token, "offset": 0}).json()["done"]
