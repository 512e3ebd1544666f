"""The parts of the page that speak in words, in dark mode at an 800 px and a 1440 px window: the status under the
buttons and the buttons' states while a run and a Compare go on, the live and final stats line with its "× N vs
plain", the runs table's, a refused value's message, and a base model's note with the chat box off. Every text is
read against what is behind it (WCAG's contrast ratio from the computed colours, opacity included), and none runs
past its box."""
import json

import pytest

from runtimes import write_base_model
from tests.browser import CONTRAST, PROMPT, app, page_at, readable, set_number, slowed, tiny_and, wait_for_runs
from tests.test_browser_buttons import wait_enabled

pytestmark = pytest.mark.browser
LOOK = "e => ['color', 'backgroundColor', 'opacity', 'filter'].map(p => getComputedStyle(e)[p]).join(' ')"
def look(page, elem_id: str) -> str:
    page.mouse.move(0, 0)  # a button under the pointer shows its hover colour
    return page.locator(f"#{elem_id}").evaluate(LOOK)


def settles_to(page, elem_id: str, want: str) -> None:
    """The button's look comes back to `want` within 5 s: its colours ease over a CSS transition, and a look read
    the moment a run ends can be one frame short of it (opacity 0.998, grayscale(0.001))."""
    page.mouse.move(0, 0)
    page.wait_for_function(f"({LOOK})(document.querySelector('#{elem_id}')) === {json.dumps(want)}", timeout=5_000)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny launch model, slowed to rounds of 15 ms (a run lasts long enough to read the page meanwhile), and a
    base model (no chat template) in the picker."""
    models = tiny_and(write_base_model(tmp_path_factory.mktemp("base"), seed=3), "tiny-base")
    models.first.rounds_fn = slowed(models.first.rounds_fn, 0.015)
    yield models
    models.close()


@pytest.fixture(scope="module")
def url(models):
    with app(models) as url:
        yield url


@pytest.fixture(params=[800, 1440], ids=["800px", "1440px"])
def dark(browser, url, request):
    with page_at(browser, url + "?__theme=dark", viewport={"width": request.param, "height": 900}) as page:
        page.wait_for_selector("#generate-btn")
        assert page.evaluate("document.body.classList.contains('dark')")
        yield page


def test_a_run_its_status_buttons_and_vs_plain_read_in_dark_mode(dark):
    page = dark
    idle = {b: look(page, b) for b in ("generate-btn", "stop-btn")}
    # a value out of range: refused by name where the output goes
    page.fill("#prompt textarea", PROMPT)
    page.locator("#chat input").uncheck()
    set_number(page, "k", 100)
    page.click("#generate-btn")
    page.wait_for_selector("#output-tokens .ds-error", timeout=30_000)
    assert "k=100 is out of range" in page.inner_text("#output-tokens")
    readable(page, "#output-tokens .ds-error, #output-tokens .ds-error b", want=2)
    # an n-gram run: while it streams the status, the live stats line and the buttons say so
    set_number(page, "k", 4)
    set_number(page, "max-new-tokens", 160)
    page.locator("#mode").get_by_label("n-gram", exact=True).check()
    page.click("#generate-btn")
    page.wait_for_function("document.querySelector('#output-tokens .ds-live-stats')?.innerText.includes('tok/s')",
                           polling=100, timeout=30_000)
    wait_enabled(page, "stop-btn", True)
    readable(page, "#status *")
    readable(page, "#output-tokens .ds-live-stats *", want=3)
    # a button that cannot be used now does not look like one that can
    assert look(page, "generate-btn") != idle["generate-btn"] and look(page, "stop-btn") != idle["stop-btn"]
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('Run 1 done')", timeout=60_000)
    wait_for_runs(page, 1)
    assert "vs plain" in page.inner_text("#stats")
    readable(page, "#status *")
    readable(page, "#stats .ds-stat, #stats .ds-stat b, #stats .ds-note", want=6)
    assert page.locator("#runs td").filter(has_text="vs plain").count() == 1
    readable(page, "#runs td .cell-wrap", want=8)
    settles_to(page, "generate-btn", idle["generate-btn"])
    settles_to(page, "stop-btn", idle["stop-btn"])


def test_compare_and_a_base_models_note_read_in_dark_mode(dark, models):
    page = dark
    page.fill("#prompt textarea", PROMPT)
    set_number(page, "max-new-tokens", 160)
    page.click("#compare-btn")
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('Compare 1/')", timeout=30_000)
    wait_enabled(page, "generate-btn", False)
    readable(page, "#status *")
    page.click("#stop-btn")
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('Compare stopped')", timeout=30_000)
    wait_enabled(page, "generate-btn", True)
    readable(page, "#status *")
    # a base model: its note says why the chat box is off
    page.locator("#model input").click()
    page.get_by_role("option", name="tiny-base", exact=True).click()
    page.wait_for_function("document.querySelector('#status')?.innerText.includes('tiny-base: ready')",
                           timeout=60_000)
    assert not page.locator("#chat input").is_enabled()
    readable(page, "#examples-note *")
    readable(page, "#status *")
    readable(page, "#chat label span")
    # and back, so the module's next page starts from the launch model
    page.locator("#model input").click()
    page.get_by_role("option", name=models.first.model_name, exact=True).click()
    page.wait_for_function(f"document.querySelector('#status')?.innerText.includes('{models.first.model_name}: "
                           "ready')", timeout=60_000)


def test_the_contrast_measure_sees_faint_text(browser):
    """The check itself can fail: grey ink at half opacity on a dark panel, and text on a tinted box."""
    page = browser.new_page()
    try:
        page.set_content('<body style="background:#0b0f19;color:#e5e7eb;margin:0"><div style="opacity:0.5">'
                         '<span style="color:#6b7280">faint</span></div><p>plain</p>'
                         '<p style="background:#fde68a">light on yellow</p></body>')
        found = dict(page.evaluate(CONTRAST, "span, p"))
        assert found["faint"] < 2 and found["plain"] > 12 and found["light on yellow"] < 1.5, found
    finally:
        page.close()
