"""A run against plain decoding of its prompt (ui/baseline.py, local.vs_plain): the stats line and the runs table
carry "× N vs plain"; the baseline is measured once per prompt and settings and kept, a plain run of the prompt
replaces it, and a kept one older than STALE_S is shown marked stale (a fake clock moves time)."""
import pytest

from engine.request import Request
from ui import baseline, callbacks, local
from ui.models import Runtimes
from ui.run import RUN_HEADERS, Session, runs_table
from ui.startup import build_runtime
from ui.testing import tiny_settings
from runtimes import QUIET

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"
OTHER = "one two three four one two three four one two"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def rt():
    rt = build_runtime(tiny=True, **QUIET)
    rt.baselines = baseline.Baselines(clock=Clock())
    yield rt
    rt.close()


def run(rt, session, prompt=PROMPT, **settings):
    outs = list(callbacks.generate(Runtimes(rt), session, prompt, **tiny_settings(**settings)))
    return [o[2] for o in outs], outs[-1][1]


def speedup_cell(session):
    return runs_table(session)[0][RUN_HEADERS.index("speedup")]


def test_a_speculative_run_is_measured_against_plain_once_per_prompt(rt):
    session = Session()
    statuses, line = run(rt, session, mode="n-gram")
    assert any(local.MEASURING_PLAIN[:40] in str(s) for s in statuses)  # it said what it was doing
    assert "vs plain" in line and "×" in line and "plain decoding of this prompt" in line
    cell = speedup_cell(session)
    assert cell.startswith("×") and cell.endswith("vs plain")
    x = float(cell[1:].split()[0])
    base = next(iter(rt.baselines.kept.values()))
    assert x == pytest.approx(session.history[-1].summary["decode_tok_s"] / base.tok_s, abs=0.006)
    assert len(session.history) == 1  # the baseline is a measurement, not a run of the session
    statuses, line = run(rt, session, mode="layer-skip", layers=2)  # the same prompt and settings: kept
    assert not any(local.MEASURING_PLAIN[:40] in str(s) for s in statuses) and "vs plain" in line
    assert len(rt.baselines.kept) == 1
    statuses, _ = run(rt, session, OTHER, mode="n-gram")  # another prompt: measured for it
    assert any(local.MEASURING_PLAIN[:40] in str(s) for s in statuses) and len(rt.baselines.kept) == 2
    statuses, _ = run(rt, session, mode="n-gram", max_new_tokens=12)  # other settings: measured for them
    assert any(local.MEASURING_PLAIN[:40] in str(s) for s in statuses) and len(rt.baselines.kept) == 3


def test_a_plain_run_is_the_baseline_and_an_old_one_is_stale(rt):
    session = Session()
    _, line = run(rt, session)  # plain: no ratio of its own, but the prompt's baseline from now on
    assert "vs plain" not in line and speedup_cell(session) is None
    (kept,) = rt.baselines.kept.values()
    assert kept.tok_s == pytest.approx(session.history[-1].summary["decode_tok_s"])
    statuses, line = run(rt, session, mode="n-gram")
    assert not any(local.MEASURING_PLAIN[:40] in str(s) for s in statuses) and "stale" not in line
    rt.baselines.clock.now += baseline.STALE_S + 1
    _, line = run(rt, session, mode="n-gram")
    assert "(stale)" in line and "stale: the machine" in line and speedup_cell(session).endswith("vs plain (stale)")
    run(rt, session)  # a plain run of the prompt measures it again
    _, line = run(rt, session, mode="n-gram")
    assert "stale" not in line


def test_the_baseline_ignores_only_what_a_drafter_reads():
    a = baseline.plain_of(Request(mode="n-gram", k=3, model="m"), "q4")
    b = baseline.plain_of(Request(mode="layer-skip", layers=2, weights="q4"), "q4")
    assert a == b and a.mode == "plain" and a.weights == "q4"
    assert baseline.plain_of(Request(mode="n-gram", weights="fp32"), "q4") != a
    assert baseline.plain_of(Request(mode="n-gram", window=64), "q4") != a


def test_a_run_in_other_weights_is_also_measured_against_the_launchs(rt):
    """A drafter that needs a denser target must beat plain decoding in the launch's weights too."""
    other = next(f for f, why in rt.formats().items() if why is None and f != rt.weight_format)
    session = Session()
    _, line = run(rt, session, mode="n-gram", weights=other)
    assert f"vs {other}" in line and f"vs {rt.weight_format} (the launch" in line
    assert len(rt.baselines.kept) == 2
    cell = speedup_cell(session)
    assert cell.startswith("×") and f"vs plain {other} (×" in cell and f"vs plain {rt.weight_format})" in cell
