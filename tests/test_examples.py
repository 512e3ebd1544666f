"""The page's examples (ui/examples.py, ui/example_check.py): a base model (no chat template in its file) gets
openings to complete with the chat box off and a line saying why; an example is offered only where it beat plain
decoding of the launch's default on this machine, the rule checked both ways with a fake timing source, the
verdicts kept per machine, and each example run against plain for real on the CPU."""
import gradio as gr
import pytest

from runtimes import QUIET, write_base_model
from ui import controls, example_check, examples
from ui.models import Runtimes
from ui.startup import build_runtime

BASE = "tiny-base"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = write_base_model(tmp_path_factory.mktemp("base"), seed=2)
    rt = build_runtime(str(folder), **QUIET)
    rt.model_name = BASE
    yield rt
    rt.close()


def test_a_base_model_gets_openings_to_complete_and_the_chat_box_off(tiny_runtime, base):
    assert examples.is_base(base) and not examples.is_base(tiny_runtime)
    rows, labels = examples.examples(base)
    prompts = {row[1]: row[0] for row in rows}
    assert prompts["n-gram"] == examples.BASE_REPEAT and prompts["layer-skip"] == examples.BASE_CODE
    assert prompts["self-draft"] == examples.BASE_PROSE and all("continue" in label or "complete" in label
                                                                  for label in labels)
    assert not any("Write" in p or "Repeat" in p for p in prompts.values())  # no instruction a base model echoes
    assert examples.examples(tiny_runtime)[0][0][0] == examples.EDIT and examples.base_note(tiny_runtime) == ""
    chat = controls.model_knobs(base)["chat"]
    assert chat["value"] is False and chat["interactive"] is False
    assert "tiny-base is a base model" in chat["info"] and "continues the prompt's text" in chat["info"]


def test_the_pick_brings_the_models_own_examples_and_keeps_a_typed_prompt(tiny_runtime, base):
    models = Runtimes(tiny_runtime, {BASE: ("reading its weights", lambda shared: base)})
    first_example = examples.offered(tiny_runtime)[0][0][0]
    out = list(controls.model_picked(models, BASE, "n-gram", "", first_example))[-1]
    status, (prompt, example_set, note) = out[0], out[-3:]
    assert "tiny-base: ready" in status and "base model" in status
    assert prompt["value"] == examples.BASE_REPEAT  # the page's example gave way to the new model's
    assert isinstance(example_set, gr.Dataset)  # gradio rebuilds the examples from these arguments
    assert example_set.constructor_args["samples"][0][0] == examples.BASE_REPEAT
    assert "base model" in note["value"] and note["visible"]
    typed = list(controls.model_picked(models, BASE, "n-gram", "", "my own words"))[-1]
    assert typed[-3] == gr.skip()  # a prompt the user wrote stays
    back = list(controls.model_picked(models, tiny_runtime.model_name, "n-gram", "", examples.BASE_REPEAT))[-1]
    assert back[-3]["value"] == examples.EDIT and not back[-1]["visible"]


def fake(tok_s: dict, sat_out: dict | None = None):
    """A timing source: tok/s (and why a drafter sat out) by mode, counting its calls."""
    def measure(rt, s, ids):
        measure.calls.append(s.mode)
        return tok_s[s.mode], (sat_out or {}).get(s.mode)

    measure.calls = []
    return measure


def test_an_example_is_offered_only_where_it_beats_plain(tiny_runtime, tmp_path):
    checks = example_check.check(tiny_runtime, fake({"plain": 100.0, "n-gram": 180.0, "self-draft": 50.0,
                                                 "layer-skip": 100.0, "draft model": 101.0}), tmp_path)
    verdict = {label.split(":")[0].split(" (")[0]: c for label, c in checks.items()}
    assert verdict["n-gram"].offered and verdict["draft model"].offered
    assert not verdict["self-draft"].offered and not verdict["layer-skip"].offered  # a tie is no win
    assert verdict["self-draft"].reason.startswith(f"×0.50 vs plain {tiny_runtime.weight_format} (50 against 100")
    rows, labels, note = examples.offered(tiny_runtime)
    assert [r[1] for r in rows] == ["n-gram", "draft model"]
    assert note.startswith("Not offered on this machine: self-draft") and "×0.50 vs plain" in note
    assert "layer-skip (calibrated" in note and "×1.00 vs plain" in note
    # the reverse: every example wins, every one is offered
    tiny_runtime.example_checks = {}
    example_check.check(tiny_runtime, fake(dict.fromkeys(("n-gram", "self-draft", "layer-skip", "draft model"), 200.0)
                                       | {"plain": 100.0}), tmp_path / "other")
    assert len(examples.offered(tiny_runtime)[0]) == 4 and examples.offered(tiny_runtime)[2] == ""
    tiny_runtime.example_checks = {}


def test_an_example_whose_drafter_sat_out_is_not_offered(tiny_runtime, tmp_path):
    """Plain steps all along are plain decoding within noise: a lucky 1% is no win, and the page says why."""
    why = "a draft of 3 of 4 layers costs about 0.93 of a step"
    measure = fake({"plain": 100.0, "n-gram": 180.0, "self-draft": 150.0, "layer-skip": 103.0, "draft model": 150.0},
                   {"layer-skip": why})
    checks = example_check.check(tiny_runtime, measure, tmp_path)
    verdict = {label.split(":")[0].split(" (")[0]: c for label, c in checks.items()}
    assert not verdict["layer-skip"].offered and verdict["layer-skip"].ratio == 1.03
    assert all(c.offered for name, c in verdict.items() if name != "layer-skip")
    assert measure.calls.count("layer-skip") == 1  # no second round: it drafts nothing whatever the load
    rows, labels, note = examples.offered(tiny_runtime)
    assert "layer-skip" not in [r[1] for r in rows]
    assert f"drafts nothing here: {why} (×1.03 vs plain" in note
    kept = example_check.check(tiny_runtime, fake({}), tmp_path)  # and the cache keeps the reason
    assert {label: c.reason for label, c in kept.items()} == {label: c.reason for label, c in checks.items()}
    tiny_runtime.example_checks = {}


def test_a_base_models_plain_example_is_offered_unchecked(base, tmp_path):
    checks = example_check.check(base, fake({"plain": 100.0, "n-gram": 50.0, "self-draft": 50.0,
                                             "layer-skip": 50.0}), tmp_path)
    assert len(checks) == 3 and not any(c.offered for c in checks.values())
    rows, labels, note = examples.offered(base)
    assert rows == [[examples.BASE_FACT, "plain", 8, 0, base.weight_format]] and labels == ["plain: complete a fact"]
    assert note.count("×0.50 vs plain") == 3
    base.example_checks = {}


def test_verdicts_are_kept_per_machine(tiny_runtime, tmp_path, monkeypatch):
    first = fake({"plain": 100.0, "n-gram": 130.0, "self-draft": 90.0, "layer-skip": 120.0, "draft model": 80.0})
    example_check.check(tiny_runtime, first, tmp_path)
    assert len(first.calls) == 4 * 2 * example_check.ROUNDS  # each example and plain, alternating
    again = fake({})  # would fail if asked: the cache answers
    kept = example_check.check(tiny_runtime, again, tmp_path)
    assert again.calls == [] and {c.offered for c in kept.values()} == {True, False}
    monkeypatch.setattr(example_check, "machine", lambda rt: "cpu:another CPU:2 threads")
    other = fake({"plain": 100.0, "n-gram": 50.0, "self-draft": 50.0, "layer-skip": 50.0, "draft model": 50.0})
    assert not any(c.offered for c in example_check.check(tiny_runtime, other, tmp_path).values())
    assert len(other.calls) == 4 * 2  # x0.5: a first round that clear decides alone
    tiny_runtime.example_checks = {}


def test_the_machine_key_tells_cpu_kinds_of_one_brand_apart(tiny_runtime, monkeypatch):
    """Zen 3, 4 and 5 EPYCs all say "AMD EPYC": a verdict measured on one must not answer for another."""
    from engine.observe import provenance

    keys = set()
    for kind in ("zen4", "zen5"):
        monkeypatch.setattr(provenance, "cpu_info", lambda kind=kind: dict(cpu_model="AMD EPYC", cpu_kind=kind))
        keys.add(example_check.machine(tiny_runtime))
    assert len(keys) == 2 and all("AMD EPYC" in k for k in keys)


def test_each_example_runs_against_plain_on_the_cpu(tiny_runtime, tmp_path):
    """The real timing source on the tiny model: every example and plain run, and the verdict follows the ratio."""
    checks = example_check.check(tiny_runtime, cache_dir=tmp_path, progress=lambda *a: None)
    assert len(checks) == len(examples.examples(tiny_runtime)[0]) == 4
    for label, c in checks.items():
        assert c.tok_s > 0 and c.plain_tok_s > 0 and c.plain_weights == tiny_runtime.weight_format, label
        assert c.offered == (c.tok_s > c.plain_tok_s and not c.sat_out)
    rows, labels, note = examples.offered(tiny_runtime)
    assert set(labels) == {label for label, c in checks.items() if c.offered}
    assert all(label in note for label, c in checks.items() if not c.offered)
    tiny_runtime.example_checks = {}
