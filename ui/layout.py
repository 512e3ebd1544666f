"""The page: components top to bottom, then the wiring. Callbacks live in callbacks.py; CSS in style.py."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import partial

import gradio as gr

from engine.request import NAMES, SINKS, SPECS
from ui import callbacks, compare, compare_plots, controls, endpoint, profile, render, run, stream
from ui.examples import EDIT, base_note, offered
from ui.models import Runtimes
from ui.page_js import KEEP_TYPED_JS, OUTPUT_TEMPLATE, SHOW_REJECTED_JS, output_js
from ui.profile_plots import PROFILE_COLUMN_WIDTHS, PROFILE_HEADERS
from ui.runtime import Runtime
from ui.style import page_css

QUEUE_MAX_SIZE = 16  # runs waiting for the engine; past this a user is told the queue is full
TITLE = "decodescope"
INTRO = ("Each token is coloured by what happened to it; the panels below show where the time went. "
         "The prompt below is ready to run: press Generate, or pick another example. "
         "Settings take effect on the next run.")
PLACEHOLDER = "Type a prompt here, or pick one of the examples below."
WEIGHTS_INFO = ("how the projections are stored: fp32, fp16, int8 blocks or 4-bit blocks (the default model's "
                "own, lossless); a format's first run loads it")
PLOT_MIN_WIDTH = 480  # px: below two of these side by side, a row wraps and the plots stack


def ranged(name: str, maximum: float | None = None) -> dict:
    """A slider's range, start and label from the setting's record (engine.request), its top lowered to
    `maximum` where the launch allows less (the cache, the model's layers)."""
    spec = SPECS[name]
    lo, hi = spec.off[0] if spec.off else spec.range[0], spec.range[1]
    hi = maximum if hi is None else hi if maximum is None else min(hi, maximum)
    return dict(minimum=lo, maximum=hi, value=min(spec.default, hi), label=spec.label)


class Knobs:
    """The settings widgets, made before the page is laid out (render=False) so that the Examples near the top
    can fill them; each is placed in the settings column by render(). Ranges, starting values and labels come
    from the request record (engine.request), so the page offers exactly what a request accepts."""

    def __init__(self, rt: Runtime):
        knobs = controls.model_knobs(rt)  # the model's: the Model picker updates them (controls.model_picked)
        hidden = dict(render=False)
        label = {name: spec.label for name, spec in SPECS.items()}
        self.mode = gr.Radio(**knobs["mode"], label=label["mode"], elem_id="mode", **hidden)
        self.k = gr.Slider(**ranged("k"), step=1, elem_id="k", **hidden)
        self.adaptive = gr.Checkbox(SPECS["adaptive"].default, label=label["adaptive"], elem_id="adaptive",
                                    info=SPECS["adaptive"].help, **hidden)
        self.ngram = gr.Slider(**ranged("ngram"), step=1, elem_id="ngram", **hidden)
        self.layers = gr.Slider(minimum=0, **knobs["layers"], step=1, label=label["layers"], elem_id="layers",
                                visible=False, **hidden)
        self.draft = gr.Dropdown(**knobs["draft"], label=label["draft_model"], elem_id="draft-model", visible=False,
                                 **hidden)
        self.graphs = gr.Checkbox(**knobs["graphs"], label=label["cuda_graphs"], elem_id="cuda-graphs", **hidden)
        self.fused = gr.Checkbox(**knobs["fused"], label=label["fused_kernels"], elem_id="fused", **hidden)
        self.weights = gr.Dropdown(**knobs["weights"], label=label["weights"], elem_id="weights", info=WEIGHTS_INFO,
                                   **hidden)
        self.window = gr.Slider(**ranged("window", rt.engine.max_seq_len), step=16,
                                info=f"0: full; W: the last W positions + {SINKS} sinks", elem_id="window", **hidden)
        self.temperature = gr.Slider(**ranged("temperature"), step=0.05, elem_id="temperature", **hidden)
        self.top_p = gr.Slider(**ranged("top_p"), step=0.05, elem_id="top-p", **hidden)
        self.top_k = gr.Slider(**ranged("top_k"), step=1, elem_id="top-k", **hidden)
        self.seed = gr.Number(SPECS["seed"].default, precision=0, label=label["seed"], elem_id="seed", **hidden)
        # the slider's reach; a typed number past it is judged like any other (the cache's room)
        self.max_new = gr.Slider(**ranged("max_new_tokens", min(1024, rt.engine.max_seq_len - 1)), step=1,
                                 elem_id="max-new-tokens", **hidden)
        self.chat = gr.Checkbox(**knobs["chat"], label=label["chat"], elem_id="chat", **hidden)

    def settings(self) -> dict:
        """The request's settings these widgets hold, by name (the backend's and the model's are elsewhere)."""
        return dict(mode=self.mode, k=self.k, adaptive=self.adaptive, ngram=self.ngram, layers=self.layers,
                    draft_model=self.draft, cuda_graphs=self.graphs, fused_kernels=self.fused, weights=self.weights,
                    window=self.window, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                    seed=self.seed, max_new_tokens=self.max_new, chat=self.chat)

    def render(self) -> None:
        """The settings column, in the request's order (the chat box sits by the prompt); PAIRS share a row."""
        column = {n: w for n, w in self.settings().items() if n != "chat"}
        names = [n for n in NAMES if n in column]
        while names:
            name = names.pop(0)
            if name in PAIRS:
                with gr.Row():
                    column[name].render()
                    column[names.pop(0)].render()
            else:
                column[name].render()


PAIRS = ("cuda_graphs", "weights", "seed")  # each shares a row with the setting after it


def page_inputs(knobs: Knobs, **others) -> dict:
    """Every setting's widget by name, in the request's order: what the engine events take by name, so the API's
    parameter names are the request's. A setting without a widget fails the page's build, naming it."""
    widgets = {**knobs.settings(), **others}
    if missing := [n for n in NAMES if n not in widgets]:
        raise KeyError(f"settings without a widget on the page: {', '.join(missing)}")
    return {n: widgets[n] for n in NAMES}


def by_name(fn, *inputs: str):
    """fn as an engine event calls it: `inputs` in order, then every setting by name. Its signature gives each
    setting a default, so an API client may leave any out, one whose widget starts empty (no draft model, no
    endpoint) included; the handler then keeps the record's default."""
    def event(*args, **settings):
        return (yield from fn(*args, **settings))

    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in inputs]
    params += [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in NAMES]
    event.__signature__ = inspect.Signature(params)
    return event


def build(models: Runtimes) -> gr.Blocks:
    """The page over the launch's models. Runs, Compare and Profile find their model's Runtime by the picker's
    value; what every Runtime shares (the export store, the stream registry) is reached through the first."""
    rt = models.first

    def end_session(session: run.Session) -> None:
        # A plain closure, not a partial: gradio deep-copies component config (this callback included) on
        # every page load, and a partial would carry a copy of the runtime, model weights and all.
        run.end_session(rt, session)

    def mode_changed(title: str, mode: str, weights: str) -> tuple:
        return controls.mode_changed(models.get(title), mode, weights)

    def weights_changed(title: str, mode: str, weights: str) -> dict:
        return controls.weights_changed(models.get(title), mode, weights)

    with gr.Blocks(title=TITLE, delete_cache=(600, 3600)) as demo:
        session = gr.State(run.Session, delete_callback=end_session)
        knobs = Knobs(rt)
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                rows, labels, left_out = offered(rt)
                prompt = gr.Textbox(rows[0][0] if rows else EDIT, label="Prompt", lines=4, max_lines=8,
                                    elem_id="prompt", placeholder=PLACEHOLDER)
                # a Dataset of our own rather than gr.Examples: a click loads the sample the page shows (the
                # model's own, after a pick), where gr.Examples loads from the list it was built with
                example_inputs = [prompt, knobs.mode, knobs.k, knobs.layers, knobs.weights]
                example_set = gr.Dataset(components=example_inputs, samples=rows, sample_labels=labels or None,
                                         label="Examples", elem_id="examples", visible=bool(rows), type="values")
                notes = " ".join(t for t in (base_note(rt), left_out) if t)
                examples_note = gr.Markdown(notes, elem_id="examples-note", visible=bool(notes))
                with gr.Row():
                    knobs.chat.render()
                    show_rejected = gr.Checkbox(True, label="Show rejected drafts", elem_id="show-rejected")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", interactive=False)
                    compare_btn = gr.Button("Compare", elem_id="compare-btn")
                # what the buttons started, said by them (below the output it fell under the fold)
                status = gr.HTML("", elem_id="status")
                legend = gr.HTML(render.legend_html(rt.tokenizer.eos_token), elem_id="legend")
                output = gr.HTML("", elem_id="output-tokens", html_template=OUTPUT_TEMPLATE,
                                 js_on_load=output_js(rt.stream_interval_s), apply_default_css=False)
                stats = gr.HTML("", elem_id="stats")
            with gr.Column(scale=2, min_width=320):
                with gr.Accordion("Environment", open=False):
                    env = gr.HTML(render.env_card(rt.env), elem_id="env")
                picker = gr.Dropdown(models.titles, value=rt.model_name, label="Model", elem_id="model",
                                     visible=len(models.titles) > 1,
                                     info="each model loads on its first pick; the settings below follow it")
                backend, endpoint_box, endpoint_url, endpoint_model, server, api_key = endpoint.widgets(rt)
                knobs.render()
        with gr.Row():
            plot_itl = gr.Plot(label="Inter-token latency", elem_id="plot-itl", min_width=PLOT_MIN_WIDTH)
            plot_steps = gr.Plot(label="Step timeline", elem_id="plot-steps", min_width=PLOT_MIN_WIDTH)
        plot_acc = gr.Plot(label="Acceptance", elem_id="plot-acceptance")
        plot_cmp = gr.Plot(label="Compare", elem_id="plot-compare")
        cmp_table = gr.Dataframe(headers=compare_plots.COMPARE_HEADERS, label="Compare figures",
                                 elem_id="compare-table", interactive=False, wrap=True)
        runs = gr.Dataframe(headers=run.RUN_HEADERS, label="Runs this session (newest first)", elem_id="runs",
                            interactive=False, wrap=True)
        with gr.Row():
            csv_btn = gr.DownloadButton("Token CSV", elem_id="csv-download", size="sm")
            trace_btn = gr.DownloadButton("Chrome trace", elem_id="trace-download", size="sm")
            runs_btn = gr.DownloadButton("Runs CSV", elem_id="runs-download", size="sm")
        panel = profile_panel(rt)

        settings = page_inputs(knobs, backend=backend, endpoint=endpoint_url, endpoint_model=endpoint_model,
                               server=server, model=picker)
        # preprocess=False: the callbacks check every value and name the setting at fault, where gradio's
        # own range check would only say "Value 40 is greater than maximum value 16".
        engine_event = dict(concurrency_limit=1, concurrency_id="engine", preprocess=False, show_progress="hidden")
        # the engine is one per process; a remote server is not: endpoint runs queue apart, a few at a time
        endpoint_event = dict(engine_event, concurrency_limit=endpoint.CONCURRENT_RUNS, concurrency_id="endpoint")
        quick = dict(queue=False, show_progress="hidden", api_visibility="private")
        timer = gr.Timer(rt.plot_interval_s, active=False)
        run_buttons = [generate_btn, compare_btn, stop_btn]
        timer.tick(partial(callbacks.live_figures, rt), [session], [plot_itl, plot_steps, plot_acc], **quick)
        # Generate starts one of two chains, by the backend picked: each waits in its own queue
        for on_endpoint, event, api in ((False, engine_event, "generate"), (True, endpoint_event, "generate_endpoint")):
            ran = (generate_btn.click(endpoint.gate(on_endpoint), [backend], None, **quick)
                   .success(callbacks.submit_live, [session], [timer, *run_buttons], **quick)
                   .success(by_name(endpoint.queued(partial(callbacks.generate, models), on_endpoint), "session",
                                    "prompt"),
                            [session, prompt], [output, stats, status], inputs_kwargs=settings, api_name=api, **event))
            # the page runs no .then after a failed event (gradio 6's frontend fires only .failure then): both
            ran.failure(callbacks.live_off, None, [timer, *run_buttons], **quick)
            (ran.then(callbacks.live_off, None, [timer, *run_buttons], **quick)
             .then(partial(callbacks.last_run, rt), [session],
                   [plot_itl, plot_steps, plot_acc, runs, csv_btn, trace_btn, runs_btn],
                   **(dict(api_visibility="private") if on_endpoint else dict(api_name="last_run"))))
        compared = (compare_btn.click(callbacks.submit_compare, [session], run_buttons, **quick)
                    .then(by_name(partial(compare.compare, models), "session", "prompt"), [session, prompt], [status],
                          inputs_kwargs=settings, api_name="compare", **engine_event))
        compared.failure(callbacks.live_off, None, [timer, *run_buttons], **quick)
        (compared.then(partial(compare.last_compare, rt), [session], [plot_cmp, cmp_table, runs, runs_btn],
                       api_name="last_compare")
         .then(callbacks.live_off, None, [timer, *run_buttons], **quick))
        panel.profile_btn.click(by_name(partial(profile.run_profile, models), "session", "prompt", "against", "steps"),
                                [session, prompt, panel.against, panel.steps], panel.outputs,
                                inputs_kwargs=settings, api_name="profile", **engine_event)
        stop_btn.click(run.stop, [session], None, queue=False, api_name="stop")
        example_set.click(controls.example_picked, [example_set], example_inputs, **quick)
        visibility = [knobs.k, knobs.ngram, knobs.layers, knobs.draft, knobs.adaptive]
        knobs.mode.change(mode_changed, [picker, knobs.mode, knobs.weights],
                          [*visibility, knobs.weights, knobs.mode], preprocess=False, **quick)
        # input, not change: a switch mode_changed made is not the user's pick, and keeps its explanation
        knobs.weights.input(weights_changed, [picker, knobs.mode, knobs.weights], [knobs.mode],
                            preprocess=False, **quick)
        # input, not change: a failed load puts the picker back, which is no new pick. Queued with the runs: a
        # first pick loads a model, which would share the cores with a run being measured.
        picked = [knobs.mode, knobs.weights, knobs.layers, knobs.draft, knobs.graphs, knobs.fused, knobs.chat]
        assert len(picked) == len(controls.MODEL_KNOBS)
        picker.input(partial(controls.model_picked, models), [picker, knobs.mode, knobs.weights, prompt],
                     [status, picker, *picked, env, legend, prompt, example_set, examples_note],
                     api_visibility="private", **engine_event)
        backend.change(endpoint.visibility, [backend], [endpoint_box], **quick)
        api_key.change(endpoint.set_key, [session, api_key], None, **quick)
        show_rejected.change(None, [show_rejected], None, api_visibility="private", js=SHOW_REJECTED_JS)
        demo.load(mode_changed, [picker, knobs.mode, knobs.weights],
                  [*visibility, knobs.weights, knobs.mode], preprocess=False, **quick)
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=None)
    return demo


@dataclass
class ProfilePanel:
    against: gr.Dropdown
    steps: gr.Slider
    profile_btn: gr.Button
    outputs: list  # status, figure, table, CSV, trace: what profile.run_profile yields


def profile_panel(rt: Runtime) -> ProfilePanel:
    """The Profile accordion: what it compares with, how many steps, the button, and its five outputs."""
    with gr.Accordion("Profile: inside a step", open=True, elem_id="profile-panel"):
        gr.Markdown(profile.INTRO)
        with gr.Row():
            against = gr.Dropdown(list(profile.AGAINST), value=profile.default_against(rt), label="compare with",
                                  elem_id="profile-against", info="the second configuration changes this")
            steps = gr.Slider(*profile.STEPS_RANGE, value=profile.DEFAULT_STEPS, step=1,
                              label="decode steps profiled", elem_id="profile-steps")
            profile_btn = gr.Button("Profile", elem_id="profile-btn")
        status = gr.HTML("", elem_id="profile-status")
        figure = gr.Plot(label="Profile", elem_id="plot-profile")
        table = gr.Dataframe(headers=PROFILE_HEADERS, label="Profile figures", elem_id="profile-table",
                             interactive=False, wrap=True, column_widths=PROFILE_COLUMN_WIDTHS)
        with gr.Row():
            csv = gr.DownloadButton("Profile CSV", elem_id="profile-csv", size="sm")
            trace = gr.DownloadButton("Profile trace", elem_id="profile-trace", size="sm")
    return ProfilePanel(against, steps, profile_btn, [status, figure, table, csv, trace])


def launch_kwargs() -> dict:
    """What launch() needs besides host and port (gradio 6 takes CSS at launch).

    run_history=False: gradio's own run history re-reads and re-writes a JSON copy of each event's outputs in
    the browser's localStorage on every streamed update, the whole token HTML included: while a run streams
    that was the page's largest script cost after rendering. The page keeps its own history (Runs this
    session, the Runs CSV). app_kwargs: the app's own route, where the page fetches a streaming run's spans
    (ui/stream.py)."""
    return dict(css=page_css(), js=KEEP_TYPED_JS, show_error=True, run_history=False,
                app_kwargs={"routes": [stream.route()]})
