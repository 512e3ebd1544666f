"""The page: components top to bottom, then the wiring. Callbacks live in callbacks.py; CSS in style.py."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import gradio as gr

from ui import callbacks, compare, compare_plots, controls, endpoint, profile, render, stream
from ui.examples import EDIT, FIRST_K, examples
from ui.models import Runtimes
from ui.page_js import OUTPUT_TEMPLATE, SHOW_REJECTED_JS, output_js
from ui.profile_plots import PROFILE_COLUMN_WIDTHS, PROFILE_HEADERS
from ui.runtime import Runtime
from ui.settings import K_RANGE, NGRAM_RANGE, SINKS, WINDOW_RANGE
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


class Knobs:
    """The settings widgets, made before the page is laid out (render=False) so that the Examples near the top
    can fill them; each is placed in the settings column by render()."""

    def __init__(self, rt: Runtime):
        knobs = controls.model_knobs(rt)  # the model's: the Model picker updates them (controls.model_picked)
        max_tokens = min(1024, rt.engine.max_seq_len - 1)
        hidden = dict(render=False)
        self.mode = gr.Radio(**knobs["mode"], label="Mode", elem_id="mode", **hidden)
        self.k = gr.Slider(*K_RANGE, value=FIRST_K, step=1, label="k (the most drafts per round)", elem_id="k",
                           **hidden)
        self.adaptive = gr.Checkbox(True, label="Adaptive k", elem_id="adaptive",
                                    info="each round drafts what the run's measured costs and acceptance say "
                                         "pays (0: a plain step); off: k every round", **hidden)
        self.ngram = gr.Slider(*NGRAM_RANGE, value=3, step=1, label="n-gram size", elem_id="ngram", **hidden)
        self.layers = gr.Slider(minimum=0, **knobs["layers"], step=1,
                                label="layer-skip layers (0: which to skip calibrated on each prompt; N: the "
                                      "first N)", elem_id="layers", visible=False, **hidden)
        self.draft = gr.Dropdown(**knobs["draft"], label="Draft model", elem_id="draft-model", visible=False,
                                 **hidden)
        self.graphs = gr.Checkbox(**knobs["graphs"], label="CUDA graphs", elem_id="cuda-graphs", **hidden)
        self.fused = gr.Checkbox(**knobs["fused"], label="Fused kernels", elem_id="fused", **hidden)
        self.weights = gr.Dropdown(**knobs["weights"], label="Weights", elem_id="weights", info=WEIGHTS_INFO,
                                   **hidden)
        self.window = gr.Slider(0, min(WINDOW_RANGE[1], rt.engine.max_seq_len), value=0, step=16,
                                label="attention window", info=f"0: full; W: the last W positions + {SINKS} sinks",
                                elem_id="window", **hidden)
        self.temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)",
                                     elem_id="temperature", **hidden)
        self.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p", elem_id="top-p", **hidden)
        self.top_k = gr.Slider(0, 200, value=0, step=1, label="top-k (0 = off)", elem_id="top-k", **hidden)
        self.seed = gr.Number(0, precision=0, label="seed", elem_id="seed", **hidden)
        self.max_new = gr.Slider(1, max_tokens, value=min(128, max_tokens), step=1, label="max new tokens",
                                 elem_id="max-new-tokens", **hidden)
        self.chat = gr.Checkbox(**knobs["chat"], label="Chat template", elem_id="chat", **hidden)

    def settings(self) -> list:
        """In callbacks.SETTINGS_FIELDS order: what every engine event takes after the prompt."""
        return [self.mode, self.k, self.ngram, self.layers, self.draft, self.graphs, self.fused, self.chat,
                self.temperature, self.top_p, self.top_k, self.seed, self.max_new, self.adaptive, self.weights,
                self.window]

    def render(self) -> None:
        """The settings column."""
        self.mode.render()
        for knob in (self.k, self.adaptive, self.ngram, self.layers, self.draft):
            knob.render()
        with gr.Row():
            self.graphs.render()
            self.fused.render()
        with gr.Row():
            self.weights.render()
            self.window.render()
        for knob in (self.temperature, self.top_p, self.top_k):
            knob.render()
        with gr.Row():
            self.seed.render()
            self.max_new.render()


def build(models: Runtimes) -> gr.Blocks:
    """The page over the launch's models. Runs, Compare and Profile find their model's Runtime by the picker's
    value; what every Runtime shares (the export store, the stream registry) is reached through the first."""
    rt = models.first

    def end_session(session: callbacks.Session) -> None:
        # A plain closure, not a partial: gradio deep-copies component config (this callback included) on
        # every page load, and a partial would carry a copy of the runtime, model weights and all.
        callbacks.end_session(rt, session)

    def mode_changed(title: str, mode: str, weights: str) -> tuple:
        return controls.mode_changed(models.get(title), mode, weights)

    def weights_changed(title: str, mode: str, weights: str) -> dict:
        return controls.weights_changed(models.get(title), mode, weights)

    with gr.Blocks(title=TITLE, delete_cache=(600, 3600)) as demo:
        session = gr.State(callbacks.Session, delete_callback=end_session)
        knobs = Knobs(rt)
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                prompt = gr.Textbox(EDIT, label="Prompt", lines=4, max_lines=8, elem_id="prompt",
                                    placeholder=PLACEHOLDER)
                rows, labels = examples(rt)
                gr.Examples(rows, inputs=[prompt, knobs.mode, knobs.k, knobs.layers, knobs.weights], label="Examples",
                            example_labels=labels, elem_id="examples")
                with gr.Row():
                    knobs.chat.render()
                    show_rejected = gr.Checkbox(True, label="Show rejected drafts", elem_id="show-rejected")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    compare_btn = gr.Button("Compare", elem_id="compare-btn")
                legend = gr.HTML(render.legend_html(rt.tokenizer.eos_token), elem_id="legend")
                output = gr.HTML("", elem_id="output-tokens", html_template=OUTPUT_TEMPLATE,
                                 js_on_load=output_js(rt.stream_interval_s), apply_default_css=False)
                stats = gr.HTML("", elem_id="stats")
                status = gr.HTML("", elem_id="status")
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
        runs = gr.Dataframe(headers=callbacks.RUN_HEADERS, label="Runs this session (newest first)", elem_id="runs",
                            interactive=False, wrap=True)
        with gr.Row():
            csv_btn = gr.DownloadButton("Token CSV", elem_id="csv-download", size="sm")
            trace_btn = gr.DownloadButton("Chrome trace", elem_id="trace-download", size="sm")
            runs_btn = gr.DownloadButton("Runs CSV", elem_id="runs-download", size="sm")
        panel = profile_panel(rt)

        # the engine's settings, then the backend's (ui/endpoint.py): SETTINGS_FIELDS order
        settings = [*knobs.settings(), backend, endpoint_url, endpoint_model, server, picker]
        assert len(settings) == len(callbacks.SETTINGS_FIELDS)
        # preprocess=False: the callbacks check every value and name the setting at fault, where gradio's
        # own range check would only say "Value 40 is greater than maximum value 16".
        engine_event = dict(concurrency_limit=1, concurrency_id="engine", preprocess=False, show_progress="hidden")
        quick = dict(queue=False, show_progress="hidden", api_visibility="private")
        timer = gr.Timer(rt.plot_interval_s, active=False)
        timer.tick(partial(callbacks.live_figures, rt), [session], [plot_itl, plot_steps, plot_acc], **quick)
        (generate_btn.click(callbacks.submit_live, [session], [timer], **quick)
         .then(partial(callbacks.generate, models), [session, prompt, *settings], [output, stats, status],
               api_name="generate", **engine_event)
         .then(callbacks.live_off, None, [timer], **quick)
         .then(partial(callbacks.last_run, rt), [session],
               [plot_itl, plot_steps, plot_acc, runs, csv_btn, trace_btn, runs_btn], api_name="last_run"))
        (compare_btn.click(callbacks.submit, [session], None, **quick)
         .then(partial(compare.compare, models), [session, prompt, *settings], [status], api_name="compare",
               **engine_event)
         .then(partial(compare.last_compare, rt), [session], [plot_cmp, cmp_table, runs, runs_btn],
               api_name="last_compare"))
        panel.profile_btn.click(partial(profile.run_profile, models),
                                [session, prompt, panel.against, panel.steps, *settings], panel.outputs,
                                api_name="profile", **engine_event)
        stop_btn.click(callbacks.stop, [session], None, queue=False, api_name="stop")
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
        picker.input(partial(controls.model_picked, models), [picker, knobs.mode, knobs.weights],
                     [status, picker, *picked, env, legend], api_visibility="private", **engine_event)
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
    return dict(css=page_css(), show_error=True, run_history=False, app_kwargs={"routes": [stream.route()]})
