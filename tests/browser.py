"""What the browser tests share: Debian's headless Chromium driven by Playwright (the modules that import this
skip without either; their `browser` fixture is in conftest.py), an app of a test's own, and the page's inputs."""
import contextlib
import os
import shutil

import pytest

from ui import layout
from ui.models import Runtimes
from ui.startup import build_runtime

CHROMIUM = os.environ.get("DECODESCOPE_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PROMPT = "one two three, one two three, one two three, one two"
VIEWPORT = {"width": 1400, "height": 1000}
QUIET = dict(device="cpu", bandwidth=False, progress=lambda *a: None)

sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (pip install playwright)")
if not shutil.which(CHROMIUM):
    pytest.skip(f"needs Chromium at {CHROMIUM} (apt-get install -y chromium)", allow_module_level=True)


@contextlib.contextmanager
def serving(browser, models):
    """A page on an app of its own over `models` (a Runtimes); the app and the page close after."""
    demo = layout.build(models)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **layout.launch_kwargs())
    context = browser.new_context(viewport=VIEWPORT)
    try:
        page = context.new_page()
        page.goto(demo.local_url)
        yield page
    finally:
        context.close()
        demo.close()


def tiny_and(folder, name: str) -> Runtimes:
    """The tiny launch model, and the model in `folder` offered in the picker as `name` (built on its first pick)."""
    def build(shared):
        rt = build_runtime(str(folder), **QUIET, shared=shared)
        rt.model_name = name
        return rt

    return Runtimes(build_runtime(tiny=True, **QUIET), {name: ("reading its weights", build)})


def set_number(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def wait_for_runs(page, n):
    """The run table lists n runs: the run's figures, table and files (last_run) have landed."""
    page.wait_for_function(
        f"(document.querySelector('#runs')?.innerText.match(/ · (eager|graph) · /g) || []).length >= {n}",
        timeout=30_000)
