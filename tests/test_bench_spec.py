"""bench/spec.py's modes on a tiny model: every drafter the benchmark times runs through the real loop and
keeps plain greedy decoding's tokens (a mode that breaks stops the whole benchmark, not one row)."""
import pytest

from bench import spec
from bench import spec_analysis as analysis
from engine import Engine, load_model, speculative
from engine.tiny import tiny_config, write_tiny_model

PROMPT = [72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 44, 32, 104, 101, 108, 108, 111, 32] * 3


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"), tiny_config())


@pytest.mark.parametrize("target", ["q4", "q4_a8", "fp32"])
def test_every_timed_mode_keeps_greedy_tokens(path, target):
    eng = Engine(load_model(path, weights=target), max_seq_len=256)
    plain, _ = eng.generate(PROMPT, 24, temperature=0.0, stop_ids=[])
    for name, what, make, k in spec.modes(target, eng):
        ids, stats = speculative.generate(eng, make(), PROMPT, k=k, max_new_tokens=24, temperature=0.0, stop_ids=[])
        assert ids == plain, (name, what)
        assert len(stats.rounds) > 1


def test_latest_match_proposes_the_latest_occurrence():
    d = analysis.LatestMatch()
    d.reset(PROMPT)
    choice = d.choose()
    assert choice is not None and d.context() == choice.ctx
    assert choice.src == max(s for s, _ in d.candidates())
