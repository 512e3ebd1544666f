"""The speculative modes in the app, on the tiny runtime: self-drafting, the calibrated layer set shown and
exported, the schedule's k per round in the CSVs, fixed k as an option, the Examples, and validation."""
import csv

import pytest

from ui.models import Runtimes
from ui import callbacks, compare, controls, explain
from ui.run import Session
from ui.examples import examples
from engine.request import CALIBRATED, Request
from ui.testing import tiny_settings

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


@pytest.fixture(scope="module")
def rt(tiny_runtime):
    return tiny_runtime


def run(rt, **overrides):
    session = Session()
    list(callbacks.generate(Runtimes(rt), session, PROMPT, **tiny_settings(**{"max_new_tokens": 24, **overrides})))
    itl, steps, acc, table, tokens_csv, trace, runs_csv = callbacks.last_run(rt, session)
    with open(tokens_csv, newline="", encoding="utf-8") as f:
        tokens = list(csv.DictReader(f))
    with open(runs_csv, newline="", encoding="utf-8") as f:
        runs = list(csv.DictReader(f))
    return acc, tokens, runs


def test_the_modes_this_launch_serves(rt):
    assert rt.modes()["self-draft"] is None and rt.self_draft_format == "q4"
    assert rt.env["self-draft"] == "q4"


def test_calibrated_layer_skip_shows_and_exports_its_layer_set(rt):
    acc, tokens, runs = run(rt, mode="layer-skip", layers=CALIBRATED)
    skipped = tokens[0]["skipped_layers"]
    assert skipped and {r["skipped_layers"] for r in tokens} == {skipped} and tokens[0]["layer_set"] == "calibrated"
    assert f"skips {skipped}" in acc.layout.title.subtitle.text
    assert runs[0]["skipped_layers"] == skipped


def test_csvs_carry_the_k_each_round_chose(rt):
    _, tokens, runs = run(rt, mode="n-gram", k=6)
    ks = {int(r["round"]): r["round_k"] for r in tokens}
    assert ks[0] == "" and all(0 <= int(ks[i]) <= 6 for i in ks if i)  # round 0 is the prefill
    assert runs[0]["mean_k"] != "" and runs[0]["adaptive"] == "True"
    _, tokens, runs = run(rt, mode="n-gram", k=3, adaptive=False)
    assert runs[0]["adaptive"] == "False"
    assert max(int(r["round_k"]) for r in tokens if r["round"] != "0") == 3  # k each round the lookup matched


def test_labels_say_the_maximum_or_the_fixed_k():
    assert Request(mode="n-gram", k=4).mode_label() == "n-gram n=3 k≤4"
    assert Request(mode="n-gram", k=4, adaptive=False).mode_label() == "n-gram n=3 k=4"
    assert Request(mode="layer-skip", k=5).mode_label() == "layer-skip calibrated k≤5"
    assert Request(mode="layer-skip", layers=2).mode_label() == "layer-skip first 2 layers k≤8"  # the default k


def test_examples_use_each_modes_best_settings(rt):
    rows, labels = examples(rt)
    by_mode = {row[1]: row for row in rows}
    assert set(by_mode) == {"n-gram", "self-draft", "layer-skip", "draft model"} and len(labels) == len(rows)
    assert by_mode["layer-skip"][3] == CALIBRATED and by_mode["n-gram"][2] == Request().k == 8
    assert by_mode["self-draft"][4] in rt.self_draft_targets()  # a target that costs more than its drafts
    for prompt, mode, k, layers, weights in rows:  # every example runs as it stands
        rt.validate(Request(cuda_graphs=False, mode=mode, k=k, layers=layers, weights=weights,
                            draft_model=next(iter(rt.drafts), "")), rt.encode(prompt, False))


def test_validate_takes_calibrated_and_needs_no_draft_slots(rt):
    ids = rt.encode(PROMPT, False)
    rt.validate(Request(cuda_graphs=False, mode="layer-skip", layers=0), ids)
    with pytest.raises(ValueError, match="0 \\(calibrated on the prompt\\) or 1..3"):
        rt.validate(Request(cuda_graphs=False, mode="layer-skip", layers=4), ids)
    room = rt.engine.max_seq_len - len(ids)
    rt.validate(Request(cuda_graphs=False, mode="n-gram", k=16, max_new_tokens=room), ids)  # plain decoding may
    with pytest.raises(ValueError, match=f"lower max new tokens to {room}"):
        rt.validate(Request(cuda_graphs=False, mode="n-gram", k=16, max_new_tokens=room + 1), ids)


def test_self_draft_is_offered_only_for_a_target_that_costs_more_than_its_drafts(rt):
    """The default launch runs q4 and drafts with q4: picking self-draft switches the target and says so before
    Generate; a q4 target picked afterwards is named in the note, and refused with the same advice."""
    assert rt.self_draft_format == "q4" and "q4" not in rt.self_draft_targets()
    assert {"fp32", "fp16"} <= set(rt.self_draft_targets())
    *_, weights, info = controls.mode_changed(rt, "self-draft", "q4")
    assert weights["value"] == "fp32"
    assert "q4 drafts for the fp32 target" in info["info"] and "switched from q4" in info["info"]
    *_, weights, info = controls.mode_changed(rt, "self-draft", "fp16")
    assert weights == controls.gr.skip() and "q4 drafts for the fp16 target" in info["info"]
    assert "switched" not in info["info"]
    assert "pick fp32, fp16" in controls.weights_changed(rt, "self-draft", "q4")["info"]
    assert controls.mode_changed(rt, "n-gram", "q4")[-1]["info"] is None  # every mode runs on this launch
    with pytest.raises(ValueError, match="pick fp32, fp16"):
        rt.validate(Request(cuda_graphs=False, mode="self-draft", weights="q4"), rt.encode(PROMPT, False))


def test_a_tab_drafts_from_its_own_earlier_answers(rt):
    """Each answer a tab's Generate finished goes into its index, which its later n-gram runs draft from (the
    run's own settings say how many tokens it held); another tab starts empty; Compare neither reads nor adds."""
    a, b = Session(), Session()
    settings = tiny_settings(mode="n-gram", max_new_tokens=24, adaptive=False)
    for i in range(2):
        list(callbacks.generate(Runtimes(rt), a, PROMPT, **settings))
        assert len(a.earlier) == 25 * (i + 1)  # each answer and the separator before it
        assert a.last[0].settings["session_tokens"] == 25 * i
    assert explain.drafter_note(a.last[0]) == "drafts from this tab's earlier answers too (25 tokens)"
    list(callbacks.generate(Runtimes(rt), b, PROMPT, **tiny_settings(max_new_tokens=24)))
    assert len(b.earlier) == 25 and len(a.earlier) == 50
    list(compare.compare(Runtimes(rt), a, PROMPT, **settings))
    assert len(a.earlier) == 50
