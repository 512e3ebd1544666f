"""A base model picked in Chromium is presented as one: its own examples (openings to complete), its first one in
the prompt box, the chat template off, and a line saying why; the instruct model's come back with it."""
import json

import pytest

from tests.browser import serving, tiny_and
from ui import examples

pytestmark = pytest.mark.browser


def test_a_base_model_gets_its_own_examples_and_the_chat_box_off(browser, tmp_path):
    from engine.tiny import tiny_config, write_tiny_model

    folder = write_tiny_model(tmp_path / "base", tiny_config(), seed=3)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]  # a base model's file has none
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    models = tiny_and(folder, "tiny-base")
    first = models.first
    try:
        with serving(browser, models) as page:
            page.wait_for_selector("#generate-btn")
            assert not page.locator("#examples-note").is_visible()  # an instruct model: nothing to explain
            assert page.locator("#chat input").is_enabled() and page.locator("#chat input").is_checked()
            assert "quote and edit" in page.inner_text("#examples")
            page.locator("#model input").click()
            page.get_by_role("option", name="tiny-base", exact=True).click()
            page.wait_for_function("document.querySelector('#status')?.innerText.includes('tiny-base: ready')",
                                   timeout=30_000)
            page.wait_for_function("document.querySelector('#examples')?.innerText.includes('continue a pattern')",
                                   timeout=10_000)
            assert "quote and edit" not in page.inner_text("#examples")
            assert "complete a fact" in page.inner_text("#examples")
            assert "tiny-base is a base model" in page.inner_text("#examples-note")
            assert "base model" in page.inner_text("#status")
            assert page.input_value("#prompt textarea") == examples.BASE_REPEAT
            assert not page.locator("#chat input").is_enabled() and not page.locator("#chat input").is_checked()
            page.get_by_role("button", name="complete a fact").click()
            page.wait_for_function(f"document.querySelector('#prompt textarea').value === {examples.BASE_FACT!r}",
                                   timeout=10_000)  # the sample shown, not the launch model's of that place
            # and back: the instruct model's examples, its first prompt, the chat box on
            page.locator("#model input").click()
            page.get_by_role("option", name=first.model_name, exact=True).click()
            page.wait_for_function(f"document.querySelector('#status')?.innerText.includes('{first.model_name}: "
                                   "ready')", timeout=30_000)
            page.wait_for_function("document.querySelector('#examples')?.innerText.includes('quote and edit')",
                                   timeout=10_000)
            assert page.input_value("#prompt textarea") == examples.EDIT
            assert page.locator("#chat input").is_enabled() and not page.locator("#examples-note").is_visible()
    finally:
        models.close()
