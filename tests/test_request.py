"""The request record: each setting's default, range and parsing declared once, the CLI's flags derived from it,
and the one function that runs a request giving what the engine's own loops give."""
import argparse

import pytest

from engine import Engine, load_model, speculative
from engine.request import NAMES, SPECS, Request, add_flags, from_flags, generate, make_drafter
from engine.sampling import SamplingParams
from engine.tiny import tiny_config, write_tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_setting_is_declared_once_with_its_help_and_what_it_accepts():
    assert len(NAMES) == len(set(NAMES)) == len(Request().flat())
    for spec in SPECS.values():
        assert spec.help and spec.label, spec.name
        if spec.type in (int, float) and spec.name != "seed":
            assert spec.range, f"{spec.name} needs a range"
    assert SPECS["temperature"].within == "sampling" and SPECS["k"].within is None
    assert SPECS["k"].default == speculative.K_DEFAULT and SPECS["k"].range == (1, speculative.K_MAX)


@pytest.mark.parametrize("values, said", [
    (dict(k=0), "k=0 is out of range; pick 1..16"),
    (dict(k=100), "k=100 is out of range; pick 1..16"),
    (dict(max_new_tokens=0), "max_new_tokens=0 is out of range; pick 1 or more"),
    (dict(temperature=5), "temperature=5 is out of range; pick 0..2"),
    (dict(window=15), "window=15 is out of range; pick 0 (full attention) or 16..8192"),
    (dict(mode="beam"), "mode='beam' is not one of plain, n-gram, self-draft, draft model or layer-skip"),
    (dict(k="2.5"), "k='2.5' must be a whole number"),
    (dict(adaptive="maybe"), "adaptive='maybe' must be true or false"),
    (dict(temperature=float("nan")), "temperature=nan must be a finite number"),
    (dict(topk=3), "unknown setting 'topk'"),
])
def test_a_value_out_of_range_is_refused_naming_the_value_and_the_range(values, said):
    with pytest.raises(ValueError) as e:
        Request.from_values(values)
    assert said in str(e.value)


def test_construction_refuses_too():
    with pytest.raises(ValueError, match="k=17 is out of range"):
        Request(k=17)
    with pytest.raises(ValueError, match="must be a whole number"):
        Request(ngram=2.0)
    assert Request(window=0).window == 0 and Request(window=16).window == 16  # 0 is "off", outside the range


def test_values_by_name_parse_widget_and_query_forms():
    r = Request.from_values(dict(k=4.0, temperature="0.5", seed=7.0, adaptive="false", draft_model=None))
    assert (r.k, r.sampling.temperature, r.sampling.seed, r.adaptive, r.draft_model) == (4, 0.5, 7, False, "")
    assert Request.from_values({}) == Request()  # a setting not named keeps its default
    assert r.with_(top_p=0.5).sampling == SamplingParams(0.5, 0.5, 0, 7)
    assert list(r.flat()) == list(NAMES) and r.as_dict("m")["model"] == "m"


def test_the_cli_flags_are_the_fields():
    p = argparse.ArgumentParser()
    add_flags(p)
    args = p.parse_args([])
    assert from_flags(args) == Request()
    args = p.parse_args(["-k", "3", "--no-adaptive", "--top-p", "0.5", "--mode", "n-gram", "-n", "9"])
    assert from_flags(args) == Request(k=3, adaptive=False, mode="n-gram", max_new_tokens=9,
                                       sampling=SamplingParams(top_p=0.5))
    flags = {a.dest for a in p._actions}
    assert set(NAMES) <= flags


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    return Engine(load_model(write_tiny_model(tmp_path_factory.mktemp("req") / "m", tiny_config(), seed=1)), 256)


def test_one_function_runs_every_mode_and_gives_plain_decodings_text(eng):
    ids = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    plain, _ = eng.generate(ids, max_new_tokens=12, temperature=0.0)
    req = Request(max_new_tokens=12, cuda_graphs=False, chat=False)
    got, stats = generate(eng, req, ids)
    assert got == plain and stats.settings["mode"] == "plain"
    for mode in ("n-gram", "layer-skip"):
        r = req.with_(mode=mode, k=4, layers=1)
        got, stats = generate(eng, r, ids, make_drafter(r, eng))
        assert got == plain, mode
        assert stats.settings["k"] == 4 and stats.settings["mode"] == mode
    with pytest.raises(ValueError, match="needs a drafting engine"):
        make_drafter(req.with_(mode="draft model"), eng)
