"""bench/step_after.py: every prelude leaves the cache where the timed step expects it, and the ratios are each
round's own."""
import pytest
import torch

from bench import step_after
from engine import Engine, load_model
from engine.tiny import tiny_config, write_tiny_model


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", tiny_config(), seed=0)
    return Engine(load_model(str(folder), weights="q4_a8", progress=lambda msg: None), max_seq_len=64)


def test_the_baseline_comes_first_then_each_verify_size_the_lookup_a_pause_a_busy_wait_and_a_flush():
    kinds = step_after.preludes([6, 17], 3.0, 600 << 20)
    assert [k for _, k, _ in kinds] == ["step", "verify", "verify", "lookup", "pause", "busy", "flush"]
    assert [a for _, _, a in kinds] == [0, 6, 17, 0, 3.0, 3.0, 600 << 20]
    assert kinds[0][0] == "after a step" and kinds[-1][0] == "after reading 600 MB"


@pytest.mark.parametrize("then", [1, 3])
@pytest.mark.parametrize("kind, arg", [("step", 0), ("verify", 5), ("lookup", 0), ("pause", 0.5), ("busy", 0.5),
                                       ("flush", 0)])
def test_each_step_runs_at_the_prompts_length_whatever_ran_before(eng, kind, arg, then):
    prompt = list(range(20, 40))
    flush = torch.zeros(1024)
    seen = []
    decode = eng.decode

    def spy(token):
        seen.append(eng.length)
        return decode(token)

    eng.decode = spy
    try:
        times = step_after.steps_after(eng, prompt, kind, arg, steps=4, flush=flush, warmup=1, then=then)
    finally:
        del eng.decode
    assert len(times) == then and all(len(ts) == 4 and all(t > 0 for t in ts) for ts in times)
    assert set(seen) == {len(prompt)} and eng.length == len(prompt)  # every decode, prelude or timed, at the prompt
    assert len(seen) == 5 * then + (5 if kind == "step" else 0)
    assert flush[0].item() == (5.0 if kind == "flush" else 0.0)


def test_a_busy_wait_takes_its_time(eng):
    import time
    prompt = list(range(20, 40))
    t = time.perf_counter()
    step_after.steps_after(eng, prompt, "busy", 20.0, steps=2, flush=None, warmup=0)
    assert time.perf_counter() - t >= 0.04  # two 20 ms waits


def test_the_lookup_prelude_runs_the_drafter_over_a_growing_sequence(eng, monkeypatch):
    seen = []

    class Spy(step_after.NgramDrafter):
        def commit(self, n_accepted, emitted):
            super().commit(n_accepted, emitted)
            seen.append(len(self.tokens))

    monkeypatch.setattr(step_after, "NgramDrafter", Spy)
    prompt = list(range(20, 40))
    step_after.steps_after(eng, prompt, "lookup", 0, steps=3, flush=None, warmup=1)
    assert seen == [21, 22, 23, 24]  # the prompt, then one token a round


def test_rows_name_the_step_after_the_prelude_when_more_than_one_is_timed():
    assert step_after.label("after a step", 0, 1) == "after a step"
    assert step_after.label("after a verify pass of 6", 2, 4) == "after a verify pass of 6, step 3"


def test_ratios_are_taken_within_a_round_then_the_median():
    rounds = [{"a": 2.0, "b": 3.0}, {"a": 4.0, "b": 4.0}, {"a": 1.0, "b": 2.0}]
    rows = step_after.summarize(["a", "b"], rounds)
    assert rows[0] == dict(prelude="a", step_ms=2.0, over_step=1.0, lo=1.0, hi=1.0)
    assert rows[1] == dict(prelude="b", step_ms=3.0, over_step=1.5, lo=1.0, hi=2.0)


def test_the_last_level_cache_is_read_from_the_kernel_or_the_default(tmp_path, monkeypatch):
    assert step_after.llc_bytes() > 0
    monkeypatch.setattr(step_after, "Path", lambda p: tmp_path / "none")
    assert step_after.llc_bytes(default=123) == 123
