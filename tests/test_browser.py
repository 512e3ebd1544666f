"""End to end in Debian's headless Chromium, driven by Playwright: what a person sees and downloads."""
import csv
import io
import os
import time

import pytest

from ui.models import Runtimes
from ui import layout
from ui.startup import build_runtime
from tests.browser import PROMPT, VIEWPORT, generate, set_number, slowed, wait_for_runs
from tests.test_browser_panels import MEASURE, problems
from runtimes import QUIET

HOSTILE = '<img src=x onerror="window.__xss = 1">'
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
    rt = build_runtime(tiny=True, **QUIET)
    rt.tokenizer = HostileTokenizer(rt.tokenizer)
    demo = layout.build(Runtimes(rt))
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    yield rt, demo.local_url
    demo.close()
    rt.close()


@pytest.fixture
def page(browser, served):
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = context.new_page()
    page.goto(served[1])
    page.wait_for_selector("#generate-btn")
    yield page
    context.close()


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
        drawn = page.evaluate(MEASURE, f"#{plot}")  # as drawn on the page, text boxes apart
        assert drawn["texts"] and not problems(drawn), (plot, problems(drawn))
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
    drawn = page.evaluate(MEASURE, "#plot-compare")
    assert drawn["texts"] and not problems(drawn), problems(drawn)
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
    monkeypatch.setattr(rt, "rounds_fn", slowed(rt.rounds_fn, 0.02))


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
    drawn = page.evaluate(MEASURE, "#plot-profile")  # as drawn on the page, text boxes apart
    assert drawn["texts"] and not problems(drawn), problems(drawn)
    # "decode" / "verify" fit their cell in its own font (measured, so a wider font than this machine's fallback
    # for the theme's monospace, which wraps them where this one might not, fails here too)
    fits = page.locator("#profile-table td .cell-wrap").evaluate_all("""cells => cells
        .filter(c => ['decode', 'verify'].includes(c.textContent.trim()))
        .map(c => {
            const style = getComputedStyle(c);
            const ctx = document.createElement('canvas').getContext('2d');
            ctx.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
            const room = c.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
            return [c.textContent.trim(), ctx.measureText(c.textContent.trim()).width, room];
        })""")
    assert fits and all(width <= room for _, width, room in fits), fits
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


@pytest.mark.parametrize("elem_id, typed, said", [("k", 100, "k=100 is out of range; pick 1..16"),
                                                   ("k", 0, "k=0 is out of range; pick 1..16"),
                                                   ("max-new-tokens", 0, "max_new_tokens=0 is out of range")])
def test_a_number_typed_past_a_slider_is_refused_by_name_not_clamped(page, elem_id, typed, said):
    page.fill("#prompt textarea", PROMPT)
    set_number(page, elem_id, typed)
    page.click("#generate-btn")  # the box loses focus here: it keeps what was typed
    page.wait_for_selector("#output-tokens .ds-error", timeout=30_000)
    assert said in page.inner_text("#output-tokens")
    assert page.input_value(f"#{elem_id} input[type=number]") == str(typed)


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


def test_a_launch_of_one_model_shows_no_picker(page):
    assert not page.locator("#model").is_visible()
