"""End to end in headless Chromium, on an app of each test's own: another backend (an endpoint) and another
model (the picker)."""
import pytest

from ui.models import Runtimes
from ui.startup import build_runtime
from tests.browser import PROMPT, QUIET, serving, set_number, tiny_and, wait_for_runs

pytestmark = pytest.mark.browser


def test_an_endpoint_run_streams_its_text_into_the_page(browser):
    """The backend choice beside the settings: an endpoint run streams the server's text into the output box,
    through the same page script as ours (its values are gradio's own updates, not the side channel)."""
    from tests.endpoint_fake import FakeServer, chunk, sse

    events = [chunk(None), chunk("Hello"), chunk(" wor"), chunk("ld", finish="stop"),
              {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}]
    rt = build_runtime(tiny=True, **QUIET)
    try:
        with FakeServer(sse(events, gap_s=0.05)) as fake:
            rt.endpoints = [fake.url]
            with serving(browser, Runtimes(rt)) as page:
                page.locator("#backend").get_by_label("endpoint", exact=True).check()
                page.wait_for_selector("#endpoint-url", state="visible")
                page.fill("#endpoint-model textarea, #endpoint-model input", "m")
                page.click("#generate-btn")
                page.wait_for_function(
                    "document.querySelector('#status')?.innerText.includes('Run 1 done: endpoint')", timeout=30_000)
                text = page.locator("#output-tokens .ds-stream").inner_text()
                assert text.replace("\n", "") == "Hello world", text
                assert page.locator("#output-tokens span.tok").count() >= 3
                assert "tok/s" in page.inner_text("#stats")
    finally:
        rt.close()


def test_the_model_picker_loads_the_second_model_and_its_runs_name_it(browser, tmp_path):
    """Two tiny models (a llama, then a gemma3_text of 3 layers built on its first pick): the picker says it loads,
    the layer-skip slider follows the pick, and the run's row in the table names the model. (A launch of one model
    shows no picker: tests/test_browser.py.)"""
    from engine.tiny import tiny_config, write_tiny_model

    folder = write_tiny_model(tmp_path / "gemma", tiny_config("gemma3_text", num_hidden_layers=3))
    models = tiny_and(folder, "tiny-gemma")
    try:
        with serving(browser, models) as page:
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
        models.close()
