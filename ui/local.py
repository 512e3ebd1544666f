"""This engine's runs on the page (ui/endpoint.py holds the same four for a serving engine's endpoint): the
check before a run, the streaming run Generate starts, a run to its end for Compare, and what Compare compares.
ui/backends.py picks between the two.
"""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

from engine.request import SINKS, Request
from engine.stats import Round, finite
from ui import render, stream
from ui.baseline import plain_of
from ui.explain import schedule_note, verify_note
from ui.pump import RoundPump
from ui.run import LiveRun, Session, begin_run, ceiling_note, record_run, refusal, starting
from ui.runtime import RunFacts, Runtime

KEEPALIVE_S = 2.0  # a streaming run's updates that change nothing; the tokens and stats go by ui/stream.py
STREAMED_NOTE = ("tok/s measured while this page streamed the tokens: on a CPU the browser's drawing shares the "
                 "cores with the engine (Compare streams nothing)")
IDLE_TICK_S = 0.25  # a Compare run yields this often, so a closed tab or Stop is noticed
COMPARE_WINDOW = 512  # the attention group's window when the run itself attends in full
COMPARE_FORMATS = ("fp32", "fp16", "int8", "q4")  # the weights group's formats, beside the run's own
MEASURING_PLAIN = ("Measuring plain decoding of this prompt with the same settings, once (kept for the next runs): "
                   "the run's × vs plain figure.")


def check(rt: Runtime, s: Request, ids: list[int]) -> None:
    rt.validate(s, ids)


def generate(rt: Runtime, session: Session, prompt: str, s: Request, ids: list[int]):
    """callbacks.generate for this engine: yields (tokens html, stats html, status html): strings, or gr.skip()
    while it streams.

    While the run streams, the tokens value is a marker naming the run: the page fetches the new spans and the
    stats line itself (ui/stream.py), and this event yields only the status once the first round arrived, and
    updates that change nothing every KEEPALIVE_S (gradio closes a dropped run at a yield). The last update
    carries the whole token HTML and the final stats line. Every other output of a streaming event would cost
    gradio a component rebuild on each update, skipped or not, so figures refresh on their own timer
    (callbacks.live_figures) and the run's figures, history and files follow once it ends (last_run)."""
    if not begin_run(session):
        yield (gr.skip(), gr.skip(), render.message_html("Stopped before it started."))
        return
    settings = s.as_dict(rt.model_name)
    # said before the pump starts: once it runs, the weights it loads would make starting() say "Running"
    said, running = starting(rt, s), f"Running {s.label()}."
    pump = RoundPump(rt, s, ids, session.run_stop, earlier=session.earlier)
    live = stream.open_stream(pump, lambda: render.stats_line(
        rt.stats(list(pump.arrived), len(ids), settings, pump.facts) if pump.arrived else None, running=True))
    session.live = LiveRun(pump.arrived, len(ids), settings, pump.facts)
    yield (live, "", render.message_html(said))  # the page shows the live stats line (stream.poll)
    try:
        for batch in pump.batches(KEEPALIVE_S):
            if batch and said != running:
                said = running
                yield (gr.skip(), gr.skip(), render.message_html(running))
            else:  # an update that changes nothing: that is when gradio can close a dropped run
                yield (gr.skip(),) * 3
    except ValueError as e:  # a setting only the engine could judge
        yield (render.error_html(str(e), "Run failed"), "", "")
        raise refusal(str(e)) from None
    finally:
        pump.close()
        stream.close_stream(live)
        session.live = None
    rounds = list(pump.arrived)
    stopped = not (rounds and rounds[-1].finished)
    stats = rt.stats(rounds, len(ids), settings, pump.facts)
    session.earlier.add(stats.ids)
    vs, extra = None, {}
    if not stopped:
        measure = vs_plain(rt, session, s, ids, stats)
        while True:  # its yields are statuses; its return, the figure
            try:
                yield (gr.skip(), gr.skip(), next(measure))
            except StopIteration as done:
                stats, extra, vs = done.value
                break
    files = record_run(rt, session, stats, s.label(), stopped, extra)
    session.last = (stats, files)
    n = len(session.history)
    note = f"Run {n} stopped after {len(stats.ids)} tokens." if stopped else f"Run {n} done: {s.label()}."
    path = next((f.path for f in pump.facts if f.path), "")
    if "requested" in path:  # graphs were asked for and did not capture: the run says what ran instead
        note += f" It ran {path}."
    html = render.render_rounds(rounds, rt.text_of, rt.special_ids)
    yield (html, final_stats(rt, stats, pump.facts, vs), render.message_html(note))


def final_stats(rt: Runtime, stats, facts: list[RunFacts], vs: tuple[str, str] | None = None) -> str:
    """The stats line of a finished run, with what its figures rest on: the ceiling's probes, how many rounds
    drafted and why, the plain baseline, and on a CPU that the page shared the cores while it streamed."""
    cpu = rt.engine.device.type == "cpu"
    weights = stats.settings.get("weights") or rt.weight_format
    notes = [n for n in (schedule_note(stats), verify_note(stats, weights) if cpu else "", STREAMED_NOTE if cpu else "")
             if n]
    return render.stats_line(stats, ceiling=ceiling_note(facts), notes=notes, vs_plain=vs)


def vs_plain(rt: Runtime, session: Session, s: Request, ids: list[int], stats):
    """Generator: a finished run against plain decoding of its prompt and settings (ui/baseline.py). A plain run
    becomes the prompt's baseline; a speculative one is compared with the kept one, measuring it first where none
    is kept (yielding a status meanwhile). A run whose weights are not the launch's is also compared with plain
    decoding in the launch's (what the page runs unless told otherwise): a drafter that needs a denser target
    must beat that too. Returns (stats with the baseline, the runs table's extra columns, (the stats line's
    figure, its tooltip)), or the stats as they were where there is nothing to compare."""
    plain = plain_of(s, rt.weight_format)
    tok_s = finite(stats.summary()["decode_tok_s"])
    if not s.speculative:
        if tok_s is not None:
            rt.baselines.put(ids, plain, tok_s)
        return stats, {}, None
    if tok_s is None:
        return stats, {}, None
    launch = plain.with_(weights=rt.weight_format)
    bases = []
    for p in dict.fromkeys([plain, launch]):
        base = rt.baselines.get(ids, p)
        if base is None:
            measured = yield from run_to_end(rt, session, p, ids, render.message_html(MEASURING_PLAIN))
            if measured is None or (plain_tok_s := finite(measured.summary()["decode_tok_s"])) is None:
                return stats, {}, None
            base = rt.baselines.put(ids, p, plain_tok_s)
        bases.append(base)
    now = rt.baselines.clock()
    stats = replace(stats, baseline_tok_s=bases[0].tok_s)
    mark = [" (stale)" if b.stale(now) else "" for b in bases]
    figure, over = f"×{tok_s / bases[0].tok_s:.2f}{mark[0]}", f"plain{mark[0]}"
    if len(bases) > 1:
        figure = f"×{tok_s / bases[0].tok_s:.2f} vs {plain.weights}{mark[0]}, ×{tok_s / bases[1].tok_s:.2f} vs " \
                 f"{launch.weights} (the launch's){mark[1]}"
        over = f"plain {plain.weights}{mark[0]} (×{tok_s / bases[1].tok_s:.2f} vs plain {launch.weights}{mark[1]})"
    tip = "; ".join(f"{p.weights}: {b.describe(now)}" for p, b in zip(dict.fromkeys([plain, launch]), bases,
                                                                        strict=True))
    return stats, dict(speedup_over=over), (figure, tip)


def run_to_end(rt: Runtime, session: Session, s: Request, ids: list[int], status: str, prompt: str = ""):
    """Generator: runs s, yielding `status` now and then; returns its Stats, or None if it was stopped."""
    rounds: list[Round] = []
    pump = RoundPump(rt, s, ids, session.run_stop)
    try:
        for batch in pump.batches(IDLE_TICK_S):
            rounds += batch
            yield status
    except ValueError as e:
        yield render.error_html(f"{s.label()}: {e}", "Compare failed")
        raise refusal(f"Compare failed at {s.label()}: {e}") from None
    finally:
        pump.close()
    if not (rounds and rounds[-1].finished):
        return None
    return rt.stats(rounds, len(ids), s.as_dict(rt.model_name), pump.facts)


def plan(rt: Runtime, s: Request, positions: int | None = None) -> list[tuple[str, str, Request | None, str | None,
                                                                            bool]]:
    """(group, label, settings or None, reason it cannot run, baseline) for each configuration Compare runs:
    eager vs CUDA graph, torch ops vs fused kernels, fp32 vs every other weight format, full vs windowed
    attention, and plain vs the selected speculative mode (n-gram when the run is plain). positions: the cache
    positions the run fills (prompt + new tokens); a window that covers them all changes nothing, so it is named
    as such rather than timed as an effect."""
    s = replace(s, weights=s.weights or rt.weight_format)  # named, so equal runs in two groups run once
    base = replace(s, mode="plain")
    spec = s if s.speculative else replace(s, mode="n-gram")
    out = []
    if rt.graphs_reason:
        out.append(("CUDA graphs", "CUDA graph", None, rt.graphs_reason, False))
    else:
        out += [("CUDA graphs", "eager", replace(base, cuda_graphs=False), None, True),
                ("CUDA graphs", "CUDA graph", replace(base, cuda_graphs=True), None, False)]
    if rt.fused_reason:
        out.append(("kernels", "fused kernels", None, rt.fused_reason, False))
    else:
        out += [("kernels", "torch ops", replace(base, fused_kernels=False), None, True),
                ("kernels", "fused kernels", replace(base, fused_kernels=True), None, False)]
    # weight formats: fp32 against each other format, all plain (the one knob that changes is the format); the
    # GGUF block formats only where the model runs one: each format quantizes the whole model on its first use
    for fmt, why in rt.formats().items():
        if why is not None or fmt not in (*COMPARE_FORMATS, s.weights):
            continue
        out.append(("weights", f"{fmt} weights", replace(base, weights=fmt), None, fmt == "fp32"))
    # attention: full against the run's window (or COMPARE_WINDOW when the run attends in full)
    window = base.window or COMPARE_WINDOW
    if positions is not None and positions <= window + SINKS:
        out.append(("attention", f"window {window} + {SINKS} sinks", None,
                    f"same as full attention at this context ({positions} positions fit in the window)", False))
    else:
        out += [("attention", "full", replace(base, window=0), None, True),
                ("attention", f"window {window} + {SINKS} sinks", replace(base, window=window), None, False)]
    out += [("speculative", "plain", base, None, True), ("speculative", spec.mode_label(), spec, None, False)]
    return out
