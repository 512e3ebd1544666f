"""The settings panel's own events: which knobs a mode uses, a self-draft target that costs more than its
drafts, said before Generate (in the mode picker's info line) rather than refused after it, and the knobs that
follow the Model picker. Plain functions of the widget values."""
from __future__ import annotations

import gradio as gr

from ui import render
from ui.examples import FIRST_MODE, base_note, examples, offered
from ui.models import Runtimes
from ui.runtime import Runtime
from engine.request import CALIBRATED, SPECS, either

VISIBLE_FOR = ("k", "ngram", "layers", "draft", "adaptive")  # the outputs of setting_visibility, in order


def setting_visibility(mode: str) -> tuple:
    """Show only the knobs the chosen mode uses: k and the adaptive schedule, n-gram size, layer-skip depth,
    draft model."""
    return (gr.update(visible=mode != "plain"), gr.update(visible=mode == "n-gram"),
            gr.update(visible=mode == "layer-skip"), gr.update(visible=mode == "draft model"),
            gr.update(visible=mode != "plain"))


def self_draft_target(rt: Runtime, weights: str) -> str | None:
    """The weight format a self-draft run's target should switch to, or None when `weights` already costs more
    than the drafts (a dense format first: its verify pass costs about a step)."""
    targets = rt.self_draft_targets()
    fmt = weights or rt.weight_format
    if fmt in targets or not targets:
        return None
    return next((f for f in ("fp32", "bf16", "fp16") if f in targets), targets[0])


def mode_note(rt: Runtime, mode: str, weights: str, switched_from: str | None = None) -> str:
    """The line under the mode picker: what self-draft drafts for, and any change made to the target for it."""
    if mode != "self-draft" or rt.self_draft_format is None:
        return ""
    fmt, drafts = weights or rt.weight_format, rt.self_draft_format
    if fmt not in rt.self_draft_targets():
        return (f"self-draft drafts with the model's own {drafts} weights, which cost as much as a {fmt} target "
                f"step: pick {either(rt.self_draft_targets()) or 'a denser format'} weights for the target.")
    note = f"self-draft: {drafts} drafts for the {fmt} target"
    if switched_from:
        note += f" (switched from {switched_from}: a draft must read fewer bytes than a target step)"
    return note + "."


def unavailable(rt: Runtime) -> str:
    """The modes this launch cannot run, each with its reason."""
    return "; ".join(f"{m}: {why}" for m, why in rt.modes().items() if why)


def mode_info(rt: Runtime, note: str) -> dict:
    """The mode picker's info line: the note on the chosen mode, then what this launch cannot run."""
    return gr.update(info=" · ".join(t for t in (note, unavailable(rt)) if t) or None)


def mode_changed(rt: Runtime, mode: str, weights: str) -> tuple:
    """(the five knobs' visibility, weights, the mode picker's info): self-draft moves a target in its drafts'
    format (or a cheaper one) to a dense format, and says so."""
    switch = self_draft_target(rt, weights) if mode == "self-draft" else None
    note = mode_note(rt, mode, switch or weights, switched_from=(weights or rt.weight_format) if switch else None)
    return (*setting_visibility(mode), gr.update(value=switch) if switch else gr.skip(), mode_info(rt, note))


def weights_changed(rt: Runtime, mode: str, weights: str) -> dict:
    """The mode picker's info again when the user picks another format for the target."""
    return mode_info(rt, mode_note(rt, mode, weights))


def model_knobs(rt: Runtime, mode: str = FIRST_MODE, weights: str = "") -> dict[str, dict]:
    """The knobs whose choices depend on the model, as keyword arguments: the page makes the widgets from them
    and the Model picker updates them with them. The mode and format stay where the model runs them."""
    modes = [m for m, why in rt.modes().items() if why is None]
    formats = [f for f, why in rt.formats().items() if why is None]
    drafts = list(rt.drafts)
    chat = rt.tokenizer.chat_template is not None
    return dict(
        mode=dict(choices=modes, value=mode if mode in modes else FIRST_MODE if FIRST_MODE in modes else modes[0],
                  info=unavailable(rt) or None),
        weights=dict(choices=formats, value=weights if weights in formats else rt.weight_format),
        layers=dict(maximum=max(1, rt.n_layers - 1), value=CALIBRATED),
        draft=dict(choices=drafts, value=drafts[0] if drafts else None, interactive=bool(drafts)),
        graphs=dict(value=SPECS["cuda_graphs"].default and rt.graphs_reason is None,
                    interactive=rt.graphs_reason is None,
                    info=rt.graphs_reason or "replay the captured decode step"),
        fused=dict(value=SPECS["fused_kernels"].default and rt.fused_reason is None,
                   interactive=rt.fused_reason is None,
                   info=rt.fused_reason or f"our {rt.engine.device.type.upper()} kernels instead of torch ops"),
        chat=dict(value=SPECS["chat"].default and chat, interactive=chat,
                  info=SPECS["chat"].help if chat else base_note(rt)),
    )


MODEL_KNOBS = ("mode", "weights", "layers", "draft", "graphs", "fused", "chat")  # model_picked's knob outputs, in order


def example_outputs(rt: Runtime, prompt: str | None = None) -> tuple:
    """(prompt, examples, the note under them) for the model: its own examples, those that beat plain decoding
    here; the prompt becomes its first example unless the user wrote one of their own (prompt None: keep it)."""
    rows, labels, note = offered(rt)
    lines = " ".join(t for t in (base_note(rt), note) if t)
    new_prompt = gr.skip() if prompt is None or not rows else gr.update(value=rows[0][0])
    return (new_prompt, gr.Dataset(samples=rows, sample_labels=labels, visible=bool(rows)),
            gr.update(value=lines, visible=bool(lines)))


def example_picked(row: list) -> tuple:
    """An example's click: its prompt, mode, k, layer-skip layers and weights into their widgets."""
    return tuple(row)


def model_picked(models: Runtimes, title: str, mode: str, weights: str, prompt: str = ""):
    """The Model picker's change: the model loads on its first pick (said first: it takes a while), then the
    knobs follow it, the environment card describes it, the legend shows its end token and the examples are its
    own (the prompt too, unless the user typed their own). Yields (status, picker, *MODEL_KNOBS, environment,
    legend, prompt, examples, examples note).
    A model that fails to load says why in the status, and the picker goes back to the first model."""
    skip = (gr.skip(),) * (len(MODEL_KNOBS) + 5)
    # a prompt that is one of the examples (or none) is the page's, not the user's: it follows the model
    own = bool((prompt or "").strip()) and all(prompt != row[0] for rt in models.built.values()
                                                for row in examples(rt)[0])
    try:
        title = models.check(title)
        if not models.is_built(title):
            yield (render.message_html(models.loading_note(title)), gr.skip(), *skip)
        rt = models.get(title)
    except ValueError as e:
        first = models.first
        yield (render.error_html(str(e), "Model not loaded"), gr.update(value=first.model_name),
               *(gr.update(**k) for k in model_knobs(first, mode, weights).values()), render.env_card(first.env),
               render.legend_html(first.tokenizer.eos_token), *example_outputs(first, None if own else prompt))
        return
    knobs = model_knobs(rt, mode, weights)
    ready = " ".join(t for t in (f"{title}: ready for the next run.", base_note(rt)) if t)
    yield (render.message_html(ready), gr.skip(), *(gr.update(**knobs[k]) for k in MODEL_KNOBS),
           render.env_card(rt.env), render.legend_html(rt.tokenizer.eos_token),
           *example_outputs(rt, None if own else prompt))
