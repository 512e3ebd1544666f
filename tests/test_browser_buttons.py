"""The buttons in Chromium say what can be done now: Stop is off while idle, Generate and Compare are off while a run
or a Compare runs, and what the run is doing is said right under the button that started it."""
import pytest

from tests.browser import PROMPT, readable, serving, set_number, slowed
from ui.models import Runtimes
from ui.startup import build_runtime
from runtimes import QUIET

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def rt():
    rt = build_runtime(tiny=True, **QUIET)
    rt.rounds_fn = slowed(rt.rounds_fn, 0.02)  # rounds of at least 20 ms: long enough to look at the buttons
    yield rt
    rt.close()


def enabled(page, elem_id) -> bool:
    return page.locator(f"#{elem_id}").is_enabled()


def wait_enabled(page, elem_id, want: bool):
    page.wait_for_function(f"document.querySelector('#{elem_id}').disabled === {'false' if want else 'true'}",
                           timeout=30_000)


def test_stop_is_on_only_while_a_run_streams_and_the_status_sits_by_the_buttons(browser, rt):
    with serving(browser, Runtimes(rt)) as page:
        page.wait_for_selector("#generate-btn")
        assert not enabled(page, "stop-btn") and enabled(page, "generate-btn") and enabled(page, "compare-btn")
        page.locator("#mode").get_by_label("plain", exact=True).check()
        page.fill("#prompt textarea", PROMPT)
        set_number(page, "max-new-tokens", 400)
        page.click("#generate-btn")
        page.wait_for_selector("#output-tokens span.tok")
        wait_enabled(page, "stop-btn", True)
        assert not enabled(page, "generate-btn") and not enabled(page, "compare-btn")
        page.wait_for_function("document.querySelector('#output-tokens .ds-live-stats')?.innerText.includes('tok/s')",
                               polling=100, timeout=10_000)
        readable(page, "#status *, #output-tokens .ds-live-stats *", want=3)  # "running" too; dark: test_browser_dark
        buttons = page.locator("#generate-btn").bounding_box()
        status = page.locator("#status").bounding_box()
        assert 0 <= status["y"] - (buttons["y"] + buttons["height"]) < 40  # right under the buttons
        page.click("#stop-btn")
        page.wait_for_function("document.querySelector('#status')?.innerText.includes('stopped after')",
                               timeout=10_000)
        wait_enabled(page, "stop-btn", False)
        wait_enabled(page, "generate-btn", True)
        assert enabled(page, "compare-btn")


def test_generate_is_off_while_compare_runs(browser, rt):
    with serving(browser, Runtimes(rt)) as page:
        page.wait_for_selector("#generate-btn")
        page.fill("#prompt textarea", PROMPT)
        set_number(page, "max-new-tokens", 24)
        page.click("#compare-btn")
        wait_enabled(page, "generate-btn", False)
        assert not enabled(page, "compare-btn") and enabled(page, "stop-btn")
        page.wait_for_function("document.querySelector('#status')?.innerText.includes('Compared')", timeout=120_000)
        wait_enabled(page, "generate-btn", True)
        wait_enabled(page, "stop-btn", False)
