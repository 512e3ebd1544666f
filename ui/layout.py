"""The page: components top to bottom, then the wiring. Callbacks live in callbacks.py; CSS in style.py."""
from __future__ import annotations

from functools import partial

import gradio as gr

from ui import callbacks, compare, endpoint, plots, profile, render
from ui.profile_plots import PROFILE_HEADERS
from ui.runtime import CALIBRATED, K_RANGE, NGRAM_RANGE, SINKS, WINDOW_RANGE, Runtime
from ui.style import page_css

QUEUE_MAX_SIZE = 16  # runs waiting for the engine; past this a user is told the queue is full
TITLE = "decodescope"
INTRO = ("Each token is coloured by what happened to it; the panels below show where the time went. "
         "Settings take effect on the next run.")
WEIGHTS_INFO = ("how the projections are stored: fp32, fp16, int8 blocks or 4-bit blocks (the default model's "
                "own, lossless); a format's first run loads it")

PROSE = "Write a short, vivid paragraph about a lighthouse keeper who finds a message in a bottle."
CODE = "Write a Python function `is_prime(n: int) -> bool` with a docstring and a few doctest examples."
EDIT = ("Repeat the following text exactly, but fix its three spelling mistakes:\n\n"
        "The old lighthouse stood at the edge of the cliff. Every nigt its lamp turned slowly, sweeping the "
        "dark water with a long beam of light. Ships that passed far out at sea could see it for miles, and "
        "sailors knew that the rocks were close. The keeper climbed the stairs each evening, cleaned the "
        "glass, and wound the clockwork that turned the lens. He wrote the weather in his log book, the "
        "direction of the wind and the heigt of the waves, and he never mised a single night.")


def examples(rt: Runtime) -> tuple[list[list], list[str]]:
    """A prompt per mode where that mode does best, each at its best settings (k is the most a round drafts;
    the schedule drafts less, or not at all, where drafting does not pay on this machine): an edit whose answer
    repeats its input for n-gram lookup, prose for the model's own quantized copy or a draft model, code for
    layer skipping over a set calibrated on the prompt. Rows: prompt, mode, k, layers, weights.

    The weights are the target's: n-gram drafts cost nothing, so it runs the launch format (the fastest);
    the model drafters draft for a target whose verify pass costs about one step, which on a CPU means a
    dense format (fp32: a 6-token verify pass ~1.05 steps; q4 needs T FMAs per weight and pays ~2.4), and
    self-draft needs a target in another format than its drafts."""
    formats = [f for f, why in rt.formats().items() if why is None]
    dense = next((f for f in ("fp32", "bf16", "fp16") if f in formats and f != rt.self_draft_format),
                 rt.weight_format)
    rows = [[EDIT, "n-gram", 8, CALIBRATED, rt.weight_format], [PROSE, "self-draft", 6, CALIBRATED, dense],
            [CODE, "layer-skip", 4, CALIBRATED, dense]]
    labels = ["n-gram: quote and edit", f"self-draft ({rt.self_draft_format} drafts, {dense} target): prose",
              f"layer-skip (calibrated, {dense}): code"]
    if rt.drafts:
        rows.append([PROSE, "draft model", 5, CALIBRATED, rt.weight_format])
        labels.append("draft model: prose")
    available = [m for m, why in rt.modes().items() if why is None]
    keep = [i for i, row in enumerate(rows) if row[1] in available]
    return [rows[i] for i in keep], [labels[i] for i in keep]


def unavailable(rt: Runtime) -> str | None:
    return "; ".join(f"{m}: {why}" for m, why in rt.modes().items() if why) or None


def setting_visibility(mode: str):
    """Show only the knobs the chosen mode uses: k and the adaptive schedule, n-gram size, layer-skip depth,
    draft model."""
    return (gr.update(visible=mode != "plain"), gr.update(visible=mode == "n-gram"),
            gr.update(visible=mode == "layer-skip"), gr.update(visible=mode == "draft model"),
            gr.update(visible=mode != "plain"))


def build(rt: Runtime) -> gr.Blocks:
    modes = [m for m, why in rt.modes().items() if why is None]
    drafts = list(rt.drafts)
    max_tokens = min(1024, rt.engine.max_seq_len - 1)

    def end_session(session: callbacks.Session) -> None:
        # A plain closure, not a partial: gradio deep-copies component config (this callback included) on
        # every page load, and a partial would carry a copy of the runtime, model weights and all.
        callbacks.end_session(rt, session)

    with gr.Blocks(title=TITLE, delete_cache=(600, 3600)) as demo:
        session = gr.State(callbacks.Session, delete_callback=end_session)
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=4, elem_id="prompt", placeholder=PROSE)
                with gr.Row():
                    chat = gr.Checkbox(True, label="Chat template", elem_id="chat",
                                       info="wrap the prompt as a user turn of the model's chat template")
                    show_rejected = gr.Checkbox(True, label="Show rejected drafts", elem_id="show-rejected")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                    compare_btn = gr.Button("Compare", elem_id="compare-btn")
                gr.HTML(render.legend_html(), elem_id="legend")
                output = gr.HTML("", elem_id="output-tokens")
                stats = gr.HTML("", elem_id="stats")
                status = gr.HTML("", elem_id="status")
            with gr.Column(scale=2):
                with gr.Accordion("Environment", open=False):
                    gr.HTML(render.env_card(rt.env), elem_id="env")
                backend, endpoint_box, endpoint_url, endpoint_model, server, api_key = endpoint.widgets(rt)
                mode = gr.Radio(modes, value="n-gram" if "n-gram" in modes else modes[0], label="Mode",
                                elem_id="mode", info=unavailable(rt))
                k = gr.Slider(*K_RANGE, value=5, step=1, label="k (the most drafts per round)", elem_id="k")
                adaptive = gr.Checkbox(True, label="Adaptive k", elem_id="adaptive",
                                       info="each round drafts what the run's measured costs and acceptance say "
                                            "pays (0: a plain step); off: k every round")
                ngram = gr.Slider(*NGRAM_RANGE, value=3, step=1, label="n-gram size", elem_id="ngram")
                layers = gr.Slider(0, max(1, rt.n_layers - 1), value=CALIBRATED, step=1,
                                   label="layer-skip layers (0: which to skip calibrated on each prompt; N: the "
                                         "first N)", elem_id="layers", visible=False)
                draft = gr.Dropdown(drafts, value=drafts[0] if drafts else None, label="Draft model",
                                    elem_id="draft-model", visible=False, interactive=bool(drafts))
                with gr.Row():
                    graphs = gr.Checkbox(rt.graphs_reason is None, label="CUDA graphs", elem_id="cuda-graphs",
                                         interactive=rt.graphs_reason is None,
                                         info=rt.graphs_reason or "replay the captured decode step")
                    fused = gr.Checkbox(rt.fused_reason is None, label="Fused kernels", elem_id="fused",
                                        interactive=rt.fused_reason is None,
                                        info=rt.fused_reason or f"our {rt.engine.device.type.upper()} kernels "
                                                                "instead of torch ops")
                with gr.Row():
                    formats = [f for f, why in rt.formats().items() if why is None]
                    weights = gr.Dropdown(formats, value=rt.weight_format, label="Weights", elem_id="weights",
                                          info=WEIGHTS_INFO)
                    window = gr.Slider(0, min(WINDOW_RANGE[1], rt.engine.max_seq_len), value=0, step=16,
                                       label=f"attention window (0: full; W: the last W positions + {SINKS} sinks)",
                                       elem_id="window")
                temperature = gr.Slider(0, 2, value=0, step=0.05, label="temperature (0 = greedy)",
                                        elem_id="temperature")
                top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p", elem_id="top-p")
                top_k = gr.Slider(0, 200, value=0, step=1, label="top-k (0 = off)", elem_id="top-k")
                with gr.Row():
                    seed = gr.Number(0, precision=0, label="seed", elem_id="seed")
                    max_new = gr.Slider(1, max_tokens, value=min(128, max_tokens), step=1,
                                        label="max new tokens", elem_id="max-new-tokens")
        rows, labels = examples(rt)
        gr.Examples(rows, inputs=[prompt, mode, k, layers, weights], label="Examples", example_labels=labels)
        with gr.Row():
            plot_itl = gr.Plot(label="Inter-token latency", elem_id="plot-itl")
            plot_steps = gr.Plot(label="Step timeline", elem_id="plot-steps")
        plot_acc = gr.Plot(label="Acceptance", elem_id="plot-acceptance")
        plot_cmp = gr.Plot(label="Compare", elem_id="plot-compare")
        cmp_table = gr.Dataframe(headers=plots.COMPARE_HEADERS, label="Compare figures", elem_id="compare-table",
                                 interactive=False, wrap=True)
        runs = gr.Dataframe(headers=callbacks.RUN_HEADERS, label="Runs this session", elem_id="runs",
                            interactive=False, wrap=True)
        with gr.Row():
            csv_btn = gr.DownloadButton("Token CSV", elem_id="csv-download", size="sm")
            trace_btn = gr.DownloadButton("Chrome trace", elem_id="trace-download", size="sm")
            runs_btn = gr.DownloadButton("Runs CSV", elem_id="runs-download", size="sm")
        with gr.Accordion("Profile: inside a step", open=True, elem_id="profile-panel"):
            gr.Markdown(profile.INTRO)
            with gr.Row():
                against = gr.Dropdown(list(profile.AGAINST), value=profile.default_against(rt), label="compare with",
                                      elem_id="profile-against", info="the second configuration changes this")
                profile_steps = gr.Slider(*profile.STEPS_RANGE, value=profile.DEFAULT_STEPS, step=1,
                                          label="decode steps profiled", elem_id="profile-steps")
                profile_btn = gr.Button("Profile", elem_id="profile-btn")
            profile_status = gr.HTML("", elem_id="profile-status")
            plot_profile = gr.Plot(label="Profile", elem_id="plot-profile")
            profile_table = gr.Dataframe(headers=PROFILE_HEADERS, label="Profile figures", elem_id="profile-table",
                                         interactive=False, wrap=True)
            with gr.Row():
                profile_csv = gr.DownloadButton("Profile CSV", elem_id="profile-csv", size="sm")
                profile_trace = gr.DownloadButton("Profile trace", elem_id="profile-trace", size="sm")

        settings = [mode, k, ngram, layers, draft, graphs, fused, chat, temperature, top_p, top_k, seed, max_new,
                    adaptive, weights, window, backend, endpoint_url, endpoint_model, server]
        assert len(settings) == len(callbacks.SETTINGS_FIELDS)
        # preprocess=False: the callbacks check every value and name the setting at fault, where gradio's
        # own range check would only say "Value 40 is greater than maximum value 16".
        engine_event = dict(concurrency_limit=1, concurrency_id="engine", preprocess=False, show_progress="hidden")
        quick = dict(queue=False, show_progress="hidden", api_visibility="private")
        timer = gr.Timer(rt.plot_interval_s, active=False)
        timer.tick(partial(callbacks.live_figures, rt), [session], [plot_itl, plot_steps, plot_acc], **quick)
        (generate_btn.click(callbacks.submit, [session], None, **quick)
         .then(callbacks.live_on, None, [timer], **quick)
         .then(partial(callbacks.generate, rt), [session, prompt, *settings], [output, stats, status],
               api_name="generate", **engine_event)
         .then(callbacks.live_off, None, [timer], **quick)
         .then(partial(callbacks.last_run, rt), [session],
               [plot_itl, plot_steps, plot_acc, runs, csv_btn, trace_btn, runs_btn], api_name="last_run"))
        (compare_btn.click(callbacks.submit, [session], None, **quick)
         .then(partial(compare.compare, rt), [session, prompt, *settings], [status], api_name="compare",
               **engine_event)
         .then(partial(compare.last_compare, rt), [session], [plot_cmp, cmp_table, runs, runs_btn],
               api_name="last_compare"))
        profile_btn.click(partial(profile.run_profile, rt), [session, prompt, against, profile_steps, *settings],
                          [profile_status, plot_profile, profile_table, profile_csv, profile_trace],
                          api_name="profile", **engine_event)
        stop_btn.click(callbacks.stop, [session], None, queue=False, api_name="stop")
        mode.change(setting_visibility, [mode], [k, ngram, layers, draft, adaptive], **quick)
        backend.change(endpoint.visibility, [backend], [endpoint_box], **quick)
        api_key.change(endpoint.set_key, [session, api_key], None, **quick)
        show_rejected.change(None, [show_rejected], None, api_visibility="private", js=(
            "(show) => { document.getElementById('output-tokens').classList.toggle('hide-rejected', !show); }"))
        demo.load(setting_visibility, [mode], [k, ngram, layers, draft, adaptive], **quick)
    demo.queue(max_size=QUEUE_MAX_SIZE, default_concurrency_limit=None)
    return demo


def launch_kwargs() -> dict:
    """What launch() needs besides host and port (gradio 6 takes CSS at launch)."""
    return dict(css=page_css(), show_error=True)
