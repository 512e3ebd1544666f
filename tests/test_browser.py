"""End to end in Debian's headless Chromium, driven by Playwright: what a person sees and downloads."""
import csv
import io
import os
import shutil
import time

import pytest

from ui.models import Runtimes
from ui import layout
from ui.startup import build_runtime

CHROMIUM = os.environ.get("DECODESCOPE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
HOSTILE = '<img src=x onerror="window.__xss = 1">'
PROMPT = "one two three, one two three, one two three, one two"

sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install playwright)")
if not shutil.which(CHROMIUM):
    pytest.skip(f"needs Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)
pytestmark = pytest.mark.browser


class HostileTokenizer:
    """The real tokenizer, except that every third token's text carries markup, as model text may."""

    def __init__(self, tok):
        self._tok = tok

    def token_text(self, token_id):
        text = self._tok.token_text(token_id)
        return text + HOSTILE if token_id % 3 == 0 else text

    def __getattr__(self, name):
        return getattr(self._tok, name)


@pytest.fixture(scope="module")
def served():
    rt = build_runtime(tiny=True, device="cpu", bandwidth=False, progress=lambda *a: None)
    rt.tokenizer = HostileTokenizer(rt.tokenizer)
    demo = layout.build(Runtimes(rt))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    yield rt, demo.local_url
    demo.close()
    rt.close()


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, served):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    page.goto(served[1])
    page.wait_for_selector("#generate-btn")
    yield page
    context.close()


def set_number(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def generate(page, mode="n-gram", max_new_tokens=48, run_no=1):
    page.locator("#mode").get_by_label(mode, exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    page.locator("#chat input").uncheck()
    set_number(page, "max-new-tokens", max_new_tokens)
    page.click("#generate-btn")
    page.wait_for_function(f"document.querySelector('#status')?.innerText.includes('Run {run_no} done')",
                           timeout=30_000)
    wait_for_runs(page, run_no)


def wait_for_runs(page, n):
    """The run table lists n runs: the run's figures, table and files (last_run) have landed."""
    page.wait_for_function(
        f"(document.querySelector('#runs')?.innerText.match(/ · (eager|graph) · /g) || []).length >= {n}",
        timeout=30_000)


def test_generate_n_gram_shows_coloured_spans_and_plots(page):
    generate(page)
    spans = page.locator("#output-tokens span.tok")
    assert spans.count() > 0
    classes = spans.evaluate_all("els => els.map(e => e.classList[1])")
    assert set(classes) <= {"tok-target", "tok-accepted", "tok-rejected", "tok-resampled", "tok-bonus"}
    assert set(classes) & {"tok-accepted", "tok-rejected", "tok-resampled", "tok-bonus"}
    spans.first.hover()  # the tooltip is built on hover from the span's data
    assert "token id" in spans.first.get_attribute("title")
    accepted_bg = page.locator("#output-tokens .tok-target, #output-tokens .tok-accepted").first.evaluate(
        "e => getComputedStyle(e).backgroundColor")
    assert accepted_bg not in ("rgba(0, 0, 0, 0)", "transparent")  # the CSS reached the page
    assert "tok/s" in page.inner_text("#stats")
    for plot in ("plot-itl", "plot-steps", "plot-acceptance"):
        page.wait_for_selector(f"#{plot} .js-plotly-plot .main-svg", timeout=10_000)
    # hiding rejected drafts is a class on the container
    page.locator("#show-rejected input").uncheck()
    assert page.locator("#output-tokens.hide-rejected").count() == 1
    if "tok-rejected" in classes:
        rejected = page.locator("#output-tokens .tok-rejected").first
        assert rejected.evaluate("e => getComputedStyle(e).display") == "none"


def test_model_text_renders_as_text(page):
    generate(page, mode="plain", max_new_tokens=24)
    assert page.locator("#output-tokens img").count() == 0
    assert page.evaluate("window.__xss") is None
    assert HOSTILE in page.inner_text("#output-tokens")


def test_compare_and_csv_download(page, served, tmp_path):
    generate(page)
    n_spans = page.locator("#output-tokens span.tok").count()
    kinds = page.locator("#output-tokens span.tok").evaluate_all("els => els.map(e => e.classList[1].slice(4))")
    with page.expect_download() as info:
        page.click("#csv-download")
    path = tmp_path / "tokens.csv"
    info.value.save_as(path)
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert len(rows) == n_spans and [r["kind"] for r in rows] == kinds
    assert {"run_id", "round", "token_index", "token_id", "token_text", "latency_ms", "p_target"} <= set(rows[0])
    page.click("#compare-btn")
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('Compared')", timeout=60_000)
    wait_for_runs(page, 3)
    page.wait_for_selector("#plot-compare .js-plotly-plot .main-svg", timeout=10_000)
    if os.environ.get("DECODESCOPE_SCREENSHOT"):  # for a person to look at
        page.screenshot(path=os.environ["DECODESCOPE_SCREENSHOT"], full_page=True)
    rt = served[0]
    assert rt.graphs_reason in page.inner_text("#compare-table")  # the reason, not an empty panel
    ran = int(page.inner_text("#status").split("Compared ")[1].split()[0])
    assert ran >= 6 and page.inner_text("#runs").count("compare:") == ran  # formats, attention, modes


@pytest.fixture
def slow_engine(served, monkeypatch):
    """Rounds of at least 20 ms: a 1000-token run cannot end by itself while a test stops it."""
    rt = served[0]
    real = rt.rounds_fn

    def slow(s, ids):
        for rnd in real(s, ids):
            time.sleep(0.02)
            yield rnd

    monkeypatch.setattr(rt, "rounds_fn", slow)


def test_stop_ends_a_long_run(page, slow_engine):
    """And while it streams, the stats line of the run so far comes with the spans (ui/stream.py)."""
    page.locator("#mode").get_by_label("plain", exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    set_number(page, "max-new-tokens", 1000)
    page.click("#generate-btn")
    page.wait_for_selector("#output-tokens span.tok")
    page.wait_for_function("document.querySelector('#output-tokens .ds-live-stats')?.innerText.includes('tok/s')",
                           polling=100, timeout=10_000)
    page.click("#stop-btn")
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('stopped after')", timeout=10_000)
    n = page.locator("#output-tokens span.tok").count()
    assert 0 < n < 1000
    assert page.inner_text("#output-tokens .ds-live-stats") == "" and "tok/s" in page.inner_text("#stats")


def test_closing_the_tab_frees_the_engine(browser, served, slow_engine):
    rt, url = served
    context = browser.new_context()
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#generate-btn")
    page.locator("#mode").get_by_label("plain", exact=True).check()
    page.fill("#prompt textarea", PROMPT)
    set_number(page, "max-new-tokens", 1000)
    page.click("#generate-btn")
    page.wait_for_selector("#output-tokens span.tok")
    assert rt.lock.locked()  # the run is on the engine
    t0 = time.monotonic()
    context.close()
    assert rt.lock.acquire(timeout=10)  # gradio dropped the run and the engine let go
    rt.lock.release()
    assert time.monotonic() - t0 < 5


def test_profile_panel_shows_the_step_and_downloads_csv_and_trace(page, served, tmp_path):
    import json

    import pandas as pd

    rt = served[0]
    page.fill("#prompt textarea", PROMPT)
    set_number(page, "profile-steps", 3)
    page.click("#profile-btn")
    page.wait_for_function("document.querySelector('#profile-status')?.innerText.includes('Profiled in')",
                           timeout=60_000)
    page.wait_for_selector("#plot-profile .js-plotly-plot .main-svg", timeout=10_000)
    assert page.locator("#plot-profile .barlayer .point").count() > 10  # layers x op classes, passes, GB/s
    figure_text = page.inner_text("#plot-profile")
    assert "a decode step by layer" in figure_text
    if rt.fused_reason:  # kernels are the default comparison: the panel says why they cannot run
        assert "not run here" in figure_text and rt.fused_reason in page.inner_text("#profile-table")
    else:  # both ran, side by side
        table = page.inner_text("#profile-table")
        assert "eager · fused" in table and "eager · torch" in table
    with page.expect_download() as info:
        page.click("#profile-csv")
    info.value.save_as(tmp_path / "profile.csv")
    df = pd.read_csv(tmp_path / "profile.csv")
    assert {"configuration", "pass", "layer", "op_class", "ms", "gbs"} <= set(df.columns) and len(df) > 20
    with page.expect_download() as info:
        page.click("#profile-trace")
    info.value.save_as(tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert any(e.get("name") == "decodescope/step" and e["ph"] == "X" for e in trace["traceEvents"])
    if os.environ.get("DECODESCOPE_SCREENSHOT"):
        page.locator("#profile-panel").screenshot(path=os.environ["DECODESCOPE_SCREENSHOT"] + ".profile.png")


def test_first_impression_a_prompt_ready_to_run_with_the_examples_in_view(page):
    assert page.input_value("#prompt textarea").startswith("Repeat the following text exactly")
    assert "n-gram" in page.locator("#mode input:checked").evaluate("e => e.value")
    examples = page.locator("#examples").bounding_box()
    assert examples["y"] + examples["height"] < 1000  # above the fold of a 1400x1000 window
    page.click("#generate-btn")  # the first Generate runs as the page opened
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('Run 1 done')", timeout=60_000)


def test_an_error_replaces_the_output_and_the_last_runs_status(page):
    generate(page, mode="plain", max_new_tokens=8)
    page.fill("#prompt textarea", "   ")
    page.click("#generate-btn")
    page.wait_for_selector("#output-tokens .ds-error", timeout=30_000)
    assert "prompt is empty" in page.inner_text("#output-tokens")
    # nothing of "Run 1 done" and its figures is left to read as this run's result
    assert page.locator("#status .ds-message, #stats .ds-stats").count() == 0
    assert page.locator(".toast-body").count() == 0  # said where the output goes, not in a fading toast
    page.fill("#prompt textarea", PROMPT)
    page.click("#generate-btn")  # the next run replaces the error
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('Run 2 done')", timeout=30_000)
    assert page.locator("#output-tokens .ds-error").count() == 0


def test_the_output_follows_the_stream_and_hovering_names_a_token(page, served):
    from ui import render

    generate(page, mode="plain", max_new_tokens=400)
    box = page.locator("#output-tokens")
    top, height, client = box.evaluate("e => [e.scrollTop, e.scrollHeight, e.clientHeight]")
    assert height > client and top + client >= height - 48  # scrolled to the newest tokens
    span = page.locator("#output-tokens span.tok").last
    span.hover()
    kind = span.evaluate("e => e.classList[1]").removeprefix("tok-")
    facts = span.get_attribute("data-t").split(" ")
    assert span.get_attribute("title") == render.token_tooltip(kind, int(span.get_attribute("data-r")), facts)


def test_special_tokens_show_as_markers(page, served, monkeypatch):
    rt = served[0]
    monkeypatch.setattr(rt, "special_ids", frozenset(range(0, rt.tokenizer.vocab_size, 4)))
    generate(page, mode="plain", max_new_tokens=40)
    marks = page.locator("#output-tokens span.tok-special")
    assert marks.count() > 0
    text, before = marks.first.evaluate("e => [e.textContent, getComputedStyle(e, '::before').content]")
    assert text == "" and before not in ("none", "normal", '""')  # no text of its own: a drawn marker


def test_dark_mode_plots_are_not_white(browser, served):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(served[1] + "?__theme=dark")
    page.wait_for_selector("#generate-btn")
    generate(page, mode="plain", max_new_tokens=12)
    page.wait_for_selector("#plot-itl .js-plotly-plot .main-svg")
    bg, ink = page.locator("#plot-itl .js-plotly-plot").evaluate(
        "e => [[getComputedStyle(e.querySelector('.main-svg')).backgroundColor,"
        "       getComputedStyle(e.querySelector('.bglayer rect.bg')).fillOpacity],"
        "      getComputedStyle(e.querySelector('.main-svg text.gtitle')).fill]")
    assert bg == ["rgba(0, 0, 0, 0)", "0"] and ink == "rgb(227, 227, 227)"  # the page's dark shows through
    context.close()


def test_narrow_screens_stack_the_plots(browser, served):
    context = browser.new_context(viewport={"width": 720, "height": 1000})
    page = context.new_page()
    page.goto(served[1])
    page.wait_for_selector("#generate-btn")
    itl, steps, acc = (page.locator(f"#{p}").bounding_box() for p in ("plot-itl", "plot-steps", "plot-acceptance"))
    assert steps["y"] >= itl["y"] + itl["height"] - 1  # one above the other
    assert abs(itl["width"] - acc["width"]) < 2  # each as wide as a full-width panel
    context.close()


def test_table_headers_break_between_words(page):
    fits = page.locator("#profile-table th").evaluate_all("""ths => ths.map(th => {
        const span = th.querySelector('.header');
        const style = getComputedStyle(span);
        const ctx = document.createElement('canvas').getContext('2d');
        ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
        const widest = Math.max(...span.textContent.trim().split(/\\s+/).map(w => ctx.measureText(w).width));
        return [span.textContent.trim(), style.wordBreak, widest <= span.getBoundingClientRect().width + 0.5];
    })""")
    assert all(word_break == "normal" and ok for _, word_break, ok in fits), fits


def test_self_draft_switches_a_target_its_drafts_cannot_help(page):
    page.locator("#weights input").click()
    page.get_by_role("option", name="q4", exact=True).click()
    page.locator("#mode").get_by_label("self-draft", exact=True).check()
    page.wait_for_function("document.querySelector('#mode')?.innerText.includes('switched from q4')",
                           timeout=10_000)
    assert page.input_value("#weights input") == "fp32"


def test_an_endpoint_run_streams_its_text_into_the_page(browser):
    """The backend choice beside the settings: an endpoint run streams the server's text into the output box,
    through the same page script as ours (its values are gradio's own updates, not the side channel)."""
    from tests.endpoint_fake import FakeServer, chunk, sse

    events = [chunk(None), chunk("Hello"), chunk(" wor"), chunk("ld", finish="stop"),
              {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}]
    rt = build_runtime(tiny=True, device="cpu", bandwidth=False, progress=lambda *a: None)
    with FakeServer(sse(events, gap_s=0.05)) as fake:
        rt.endpoints = [fake.url]
        demo = layout.build(Runtimes(rt))
        demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            page.goto(demo.local_url)
            page.locator("#backend").get_by_label("endpoint", exact=True).check()
            page.wait_for_selector("#endpoint-url", state="visible")
            page.fill("#endpoint-model textarea, #endpoint-model input", "m")
            page.click("#generate-btn")
            page.wait_for_function("document.querySelector('#status')?.innerText.includes('Run 1 done: endpoint')",
                                   timeout=30_000)
            text = page.locator("#output-tokens .ds-stream").inner_text()
            assert text.replace("\n", "") == "Hello world", text
            assert page.locator("#output-tokens span.tok").count() >= 3
            assert "tok/s" in page.inner_text("#stats")
        finally:
            context.close()
            demo.close()
            rt.close()


def test_the_model_picker_loads_the_second_model_and_its_runs_name_it(browser, page, tmp_path):
    """Two tiny models (a llama, then a gemma3_text of 3 layers built on its first pick): the picker says it loads,
    the layer-skip slider follows the pick, and the run's row in the table names the model. A launch of one model
    shows no picker."""
    from engine.tiny import tiny_config, write_tiny_model

    assert not page.locator("#model").is_visible()
    folder = write_tiny_model(tmp_path / "gemma", tiny_config("gemma3_text", num_hidden_layers=3))
    quiet = dict(device="cpu", bandwidth=False, progress=lambda *a: None)

    def build(shared):
        rt = build_runtime(str(folder), **quiet, shared=shared)
        rt.model_name = "tiny-gemma"
        return rt

    first = build_runtime(tiny=True, **quiet)
    models = Runtimes(first, {"tiny-gemma": ("reading its weights", build)})
    demo = layout.build(models)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(demo.local_url)
        page.locator("#model input").click()
        page.get_by_role("option", name="tiny-gemma", exact=True).click()
        page.wait_for_function("document.querySelector('#status')?.innerText.includes('tiny-gemma: ready')",
                               timeout=30_000)
        page.locator("#mode").get_by_label("layer-skip", exact=True).check()
        assert page.get_attribute("#layers input[type=range]", "max") == "2"
        page.locator("#mode").get_by_label("plain", exact=True).check()
        page.fill("#prompt textarea", PROMPT)
        set_number(page, "max-new-tokens", 8)
        page.click("#generate-btn")
        page.wait_for_function("document.querySelector('#status')?.innerText.includes('Run 1 done')",
                               timeout=30_000)
        wait_for_runs(page, 1)
        assert "tiny-gemma" in page.inner_text("#runs")
    finally:
        context.close()
        demo.close()
        models.close()
