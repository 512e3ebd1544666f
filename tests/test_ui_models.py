"""The page's model picker (ui/models.py, controls.model_picked) over two tiny models of different families: a
llama built at launch and a gemma3_text one built on its first pick."""
import threading
from html import escape
from functools import partial

import gradio as gr
import pytest

from engine.tiny import tiny_config, write_tiny_model
from runtimes import QUIET, read_csv
from ui import callbacks, controls
from ui import run as ui_run
from ui.run import Session
from ui.models import Runtimes
from ui.startup import build_runtime
from ui.testing import tiny_settings

PROMPT = "the cat sat on the mat. the cat"
GEMMA = "tiny-gemma"
GEMMA_LAYERS = 3  # the tiny llama has 4: the layer-skip slider must follow the pick


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    cfg = tiny_config("gemma3_text", num_hidden_layers=GEMMA_LAYERS)
    return write_tiny_model(tmp_path_factory.mktemp("gemma"), cfg)


def picker(first, later_builds: dict) -> Runtimes:
    return Runtimes(first, {title: ("reading its weights", build) for title, build in later_builds.items()})


@pytest.fixture(scope="module")
def models(tiny_runtime, gemma_dir):
    built = []

    def build(shared):
        built.append(1)
        rt = build_runtime(str(gemma_dir), **QUIET, shared=shared)
        rt.model_name = GEMMA
        return rt

    models = picker(tiny_runtime, {GEMMA: build})
    models.builds = built
    yield models
    models.built.pop(tiny_runtime.model_name)  # the module's, closed by its fixture
    models.close()


def test_the_first_pick_loads_the_model_then_its_runs_name_it(models, tiny_runtime):
    session = Session()
    assert models.titles == [tiny_runtime.model_name, GEMMA] and not models.is_built(GEMMA)
    outs = list(callbacks.generate(models, session, PROMPT, **tiny_settings(model=GEMMA, max_new_tokens=8)))
    assert "Loading tiny-gemma (first use: reading its weights)" in outs[0][2]
    assert "done" in outs[-1][2] and models.is_built(GEMMA) and models.builds == [1]
    rt = models.get(GEMMA)
    assert rt.engine.config.model_type == "gemma3_text"
    assert rt.store is tiny_runtime.store and rt.lock is tiny_runtime.lock
    list(callbacks.generate(models, session, PROMPT, **tiny_settings(max_new_tokens=8)))  # "" is the first model
    table = ui_run.runs_table(session)
    model_col = ui_run.RUN_HEADERS.index("model")
    assert [row[model_col] for row in table] == [tiny_runtime.model_name, GEMMA]  # newest first
    _, tokens_csv, _, runs_csv = callbacks.last_run(tiny_runtime, session)[3:]
    assert {r["model"] for r in read_csv(tokens_csv)} == {tiny_runtime.model_name}
    assert [r["model"] for r in read_csv(runs_csv)] == [GEMMA, tiny_runtime.model_name]
    # a second pick of a loaded model says nothing of loading, and builds nothing
    outs = list(callbacks.generate(models, Session(), PROMPT, **tiny_settings(model=GEMMA, max_new_tokens=4)))
    assert "Loading" not in outs[0][2] and models.builds == [1]


def test_the_knobs_follow_the_pick(models, tiny_runtime):
    outs = list(controls.model_picked(models, GEMMA, "draft model", "fp16"))
    status, pick, *knobs, env, legend, prompt, example_set, note = outs[-1]
    assert "ready" in status and pick == gr.skip()
    k = dict(zip(controls.MODEL_KNOBS, knobs, strict=True))
    assert "draft model" not in k["mode"]["choices"] and k["mode"]["value"] == "n-gram"  # no draft for this model
    assert "draft model: no draft model" in k["mode"]["info"]
    assert k["layers"]["maximum"] == GEMMA_LAYERS - 1 and k["weights"]["value"] == "fp16"
    assert k["draft"]["choices"] == [] and k["draft"]["interactive"] is False
    assert k["chat"]["value"] is True  # the tiny gemma has the tiny models' template
    assert "gemma3_text" in env
    assert f'data-mark="{escape(models.get(GEMMA).tokenizer.eos_token)}"' in legend  # its own end token
    # and back: the first model's draft model is offered again
    out = list(controls.model_picked(models, tiny_runtime.model_name, "draft model", ""))[-1]
    status, pick, *knobs, env, legend, _, _, _ = out
    k = dict(zip(controls.MODEL_KNOBS, knobs, strict=True))
    assert k["mode"]["value"] == "draft model" and k["draft"]["choices"] == ["tiny-draft"]
    assert k["layers"]["maximum"] == tiny_runtime.n_layers - 1


def test_a_model_that_fails_to_load_is_named_and_the_first_keeps_serving(tiny_runtime, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-family"}')
    models = picker(tiny_runtime, {"broken": partial(build_runtime, str(tmp_path), **QUIET)})
    gen = callbacks.generate(models, Session(), PROMPT, **tiny_settings(model="broken", max_new_tokens=4))
    assert "Loading broken" in next(gen)[2]
    html, stats, status = next(gen)
    assert "broken could not load" in html and "tiny still serves" in html and (stats, status) == ("", "")
    with pytest.raises(gr.Error, match="broken could not load"):
        next(gen)
    assert not models.is_built("broken")
    status, pick, *_ = list(controls.model_picked(models, "broken", "plain", ""))[-1]
    assert "broken could not load" in status
    assert pick["value"] == tiny_runtime.model_name  # the picker goes back to the model that serves
    outs = list(callbacks.generate(models, Session(), PROMPT, **tiny_settings(max_new_tokens=4)))
    assert "done" in outs[-1][2]


def test_an_unknown_model_is_refused_naming_the_choices(models):
    gen = callbacks.generate(models, Session(), PROMPT, **tiny_settings(model="gpt-9"))
    html, _, _ = next(gen)
    assert "gpt-9&#x27; is not one this app offers" in html and GEMMA in html


def test_two_users_picking_at_once_load_the_model_once(tiny_runtime):
    built, gate = [], threading.Event()

    def slow_build(shared):
        gate.wait(5)
        built.append(1)
        return tiny_runtime  # any Runtime will do: the holder only keeps it

    models = picker(tiny_runtime, {"other": slow_build})
    got = []
    threads = [threading.Thread(target=lambda: got.append(models.get("other"))) for _ in range(2)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert built == [1] and got == [tiny_runtime, tiny_runtime]
