"""The page's layout in Chromium: the plots on the dark theme's background, stacked on a narrow screen, and every
panel readable at an 800 px and a 1440 px window after a run, a Compare and a Profile."""
import pytest

from tests.browser import VIEWPORT, app, generate, set_number, wait_for_runs
from tests.test_browser_panels import MEASURE, problems
from ui.models import Runtimes

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def url(tiny_runtime):
    with app(Runtimes(tiny_runtime)) as url:
        yield url


def test_dark_mode_plots_are_not_white(browser, url):
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    page.goto(url + "?__theme=dark")
    page.wait_for_selector("#generate-btn")
    generate(page, mode="plain", max_new_tokens=12)
    page.wait_for_selector("#plot-itl .js-plotly-plot .main-svg")
    bg, ink = page.locator("#plot-itl .js-plotly-plot").evaluate(
        "e => [[getComputedStyle(e.querySelector('.main-svg')).backgroundColor,"
        "       getComputedStyle(e.querySelector('.bglayer rect.bg')).fillOpacity],"
        "      getComputedStyle(e.querySelector('.main-svg text.gtitle')).fill]")
    assert bg == ["rgba(0, 0, 0, 0)", "0"] and ink == "rgb(227, 227, 227)"  # the page's dark shows through
    context.close()


def test_narrow_screens_stack_the_plots(browser, url):
    context = browser.new_context(viewport={"width": 720, "height": 1000})
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#generate-btn")
    itl, steps, acc = (page.locator(f"#{p}").bounding_box() for p in ("plot-itl", "plot-steps", "plot-acceptance"))
    assert steps["y"] >= itl["y"] + itl["height"] - 1  # one above the other
    assert abs(itl["width"] - acc["width"]) < 2  # each as wide as a full-width panel
    context.close()


@pytest.mark.parametrize("width", [800, 1440])
def test_every_panel_reads_at_800_and_1440_px(browser, url, width):
    """The page at a narrow and a wide window after a run, a Compare and a Profile: in each plot no text box
    overlaps another or runs off, and no bar label sits on a marker."""
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        page.goto(url)
        page.wait_for_selector("#generate-btn")
        generate(page)
        page.click("#compare-btn")
        page.wait_for_function("document.querySelector('#status')?.innerText.includes('Compared')", timeout=60_000)
        wait_for_runs(page, 3)
        set_number(page, "profile-steps", 3)
        page.click("#profile-btn")
        page.wait_for_function("document.querySelector('#profile-status')?.innerText.includes('Profiled in')",
                               timeout=60_000)
        for plot in ("plot-itl", "plot-steps", "plot-acceptance", "plot-compare", "plot-profile"):
            page.wait_for_selector(f"#{plot} .js-plotly-plot .main-svg", timeout=10_000)
            drawn = page.evaluate(MEASURE, f"#{plot}")
            assert drawn["texts"] and not problems(drawn), (plot, problems(drawn))
    finally:
        context.close()
