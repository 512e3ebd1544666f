"""Every figure the page draws, in Chromium at the widths a plot gets on an 800 px and a 1440 px window: no two
text boxes overlap, none runs off the figure, and no bar label sits on a marker. Measured from the SVG's text
elements' boxes (getBoundingClientRect), not from a look at the screenshots (which are kept for a person)."""
import json
import os
from pathlib import Path

import plotly.graph_objects as go
import pytest
from plotly.offline import get_plotlyjs

from tests.browser import ARGS, CHROMIUM, sync_api  # noqa: F401  (skips this module without them)
from tests.test_plots import RUNS
from tests.test_profile_panel import fake_result
from ui import compare, compare_plots, plots, profile_plots
from engine.request import Request
from ui.testing import synthetic_stats

pytestmark = pytest.mark.browser
# the width a plot gets on the page: the window less gradio's side padding and the block's border. The latency and
# step plots share a row where two fit (ui.layout.PLOT_MIN_WIDTH each): at 1440 px, half of it; at 800 px they stack.
WIDTHS = {"800px": 676, "1440px": 1400, "1440px, half a row": 640}  # as measured on the page
HALF_ROW = ("itl", "steps")
CASES = [(name, w) for name in ("itl", "steps", "acceptance", "compare", "profile", "profile-under-read")
         for w in ("800px", "1440px, half a row" if name in HALF_ROW else "1440px")]
SLACK = 1.0  # px: boxes that share an edge after rounding are not overlapping

MEASURE = """(plot) => {
  const root = document.querySelector(plot + ' .main-svg').getBoundingClientRect();
  const box = r => ({x0: r.left, y0: r.top, x1: r.right, y1: r.bottom});
  const texts = [...document.querySelectorAll(plot + ' svg text')]
    .filter(t => t.textContent.trim() && getComputedStyle(t).display !== 'none' && t.getAttribute('opacity') !== '0')
    .map(t => Object.assign(box(t.getBoundingClientRect()), {text: t.textContent.trim(),
                                                            bar: !!t.closest('.bartext, .textpoint')}))
    .filter(b => b.x1 - b.x0 > 0 && b.y1 - b.y0 > 0);
  const markers = [...document.querySelectorAll(plot + ' .scatterlayer .points path.point')]
    .map(p => box(p.getBoundingClientRect()));
  return {figure: box(root), texts, markers};
}"""


def compare_like_entries():
    """A Compare as the page plans it: every group, the long labels included, one configuration not run."""
    plain, spec = Request(mode="plain"), Request(mode="n-gram", k=4)
    fused, q4, window = (Request(mode="plain", fused_kernels=True), Request(mode="plain", weights="q4"),
                         Request(mode="plain", window=512))
    configs = [("CUDA graphs", "CUDA graph", None, "CUDA graphs need a CUDA device", False),
               ("kernels", "torch ops", plain, None, True), ("kernels", "fused kernels", fused, None, False),
               ("weights", "fp32 weights", plain, None, True), ("weights", "q4 weights", q4, None, False),
               ("attention", "full", plain, None, True), ("attention", "window 512 + 4 sinks", window, None, False),
               ("speculative", "plain", plain, None, True), ("speculative", "n-gram n=3 k≤4", spec, None, False)]
    runs = {plain: RUNS["plain"], fused: synthetic_stats(30, seed=5), q4: synthetic_stats(30, seed=6),
            window: synthetic_stats(30, seed=7), spec: RUNS["spec"]}
    return compare.entries(configs, runs)


def figures() -> dict[str, go.Figure]:
    spec = synthetic_stats(40, k=4, seed=3, mode="layer-skip")
    spec.rounds[0].draft_info = dict(drafter="layer_skip", draft_layers=20, target_layers=24, layer_set="calibrated",
                                     skipped_layers="5 9 13 17", calibrated_acceptance=0.62)
    for r in spec.rounds:  # a calibration of 900 ms in round 0: the timeline's own lane
        r.t_start_ms, r.t_end_ms = r.t_start_ms + (900.0 if r.index else 0.0), r.t_end_ms + 900.0
    spec.rounds[0].draft_ms = 900.0
    second = fake_result("eager · torch · fp32", 1.04)
    probed = [fake_result("eager · fused · q4", 1.0, ceiling=24.7), fake_result("eager · torch · fp32", 1.04, 24.7)]
    for s in (*probed[0].summary, *probed[1].summary):
        s["probes_gbs"] = [24.7, 22.0, 23.5]
    return {
        "itl": plots.itl_figure(spec),
        "steps": plots.steps_figure(spec),
        "acceptance": plots.acceptance_figure(spec),
        "compare": compare_plots.compare_figure(compare_like_entries()),
        "profile": profile_plots.profile_figure([fake_result("eager · fused · q4", 1.0), second]),
        "profile-under-read": profile_plots.profile_figure(probed),
    }


@pytest.fixture(scope="module")
def plotly_js(tmp_path_factory):
    path = tmp_path_factory.mktemp("js") / "plotly.min.js"
    path.write_text(get_plotlyjs(), encoding="utf-8")
    return path


def overlaps(a, b) -> bool:
    return (min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > SLACK
            and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > SLACK)


def problems(m: dict) -> list[str]:
    fig, texts = m["figure"], m["texts"]
    out = [f"{t['text']!r} runs off the figure" for t in texts
           if t["x0"] < fig["x0"] - SLACK or t["x1"] > fig["x1"] + SLACK or t["y0"] < fig["y0"] - SLACK
           or t["y1"] > fig["y1"] + SLACK]
    out += [f"{a['text']!r} overlaps {b['text']!r}" for i, a in enumerate(texts) for b in texts[i + 1:]
            if overlaps(a, b)]
    out += [f"bar label {t['text']!r} sits on a marker" for t in texts if t["bar"]
            for p in m["markers"] if overlaps(t, p)]
    return out


@pytest.mark.parametrize(("name", "window"), CASES)
def test_every_panel_is_readable(browser, plotly_js, tmp_path, name, window):
    measured = draw(browser, plotly_js, tmp_path, figures()[name], f"{name}-{WIDTHS[window]}px", WIDTHS[window])
    assert measured["texts"], "no text drawn"
    found = problems(measured)
    assert not found, json.dumps(found[:12], ensure_ascii=False, indent=1)


def draw(browser, plotly_js, tmp_path, fig: go.Figure, name: str, width: int) -> dict:
    """fig drawn by plotly.js in a div `width` px wide; its screenshot kept (DECODESCOPE_SCREENSHOTS: where), its
    text and marker boxes measured."""
    html = tmp_path / f"{name}.html"
    html.write_text(
        f'<html><body style="margin:0"><div id="plot" style="width:{width}px"></div>'
        f'<script src="{plotly_js.as_uri()}"></script><script>const fig = {fig.to_json()};'
        'Plotly.newPlot("plot", fig.data, fig.layout, {responsive: true}).then(() => { window.drawn = true; });'
        '</script></body></html>', encoding="utf-8")
    page = browser.new_page(viewport={"width": width + 40, "height": 1200})
    try:
        page.goto(html.as_uri())
        page.wait_for_function("window.drawn === true", timeout=30_000)
        shots = Path(os.environ.get("DECODESCOPE_SCREENSHOTS", tmp_path))
        page.locator("#plot").screenshot(path=str(shots / f"{name}.png"))
        return page.evaluate(MEASURE, "#plot")
    finally:
        page.close()


def test_the_measure_sees_an_overlap_and_a_label_on_a_marker(browser, plotly_js, tmp_path):
    """The check itself can fail: a bar label under a marker, and two annotations on one spot."""
    fig = go.Figure([go.Bar(x=["a"], y=[10], text=["a long bar label"], textposition="outside", cliponaxis=False),
                     go.Scatter(x=["a"], y=[10.4], mode="markers", marker=dict(size=14))])
    fig.add_annotation(text="one caption", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
    fig.add_annotation(text="another caption", x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False)
    fig.update_yaxes(range=[0, 14])
    found = problems(draw(browser, plotly_js, tmp_path, fig, "broken", 400))
    assert any("sits on a marker" in p for p in found) and any("overlaps" in p for p in found), found
