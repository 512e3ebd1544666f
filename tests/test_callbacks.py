"""The page's callbacks called directly, on a tiny random-weight engine (no server, no browser)."""
import dataclasses
import threading
import time

import gradio as gr
import pytest

from engine.request import Request
from engine.stats import KINDS
from ui import callbacks
from ui import run as ui_run
from ui.models import Runtimes
from ui.run import Session, parse_settings
from ui.testing import tiny_settings
from runtimes import read_csv

MAX_NEW_TOKENS = 24
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


def values(**overrides):
    return tiny_settings(**{"max_new_tokens": MAX_NEW_TOKENS, **overrides})


@pytest.fixture(scope="module")
def rt(tiny_runtime):
    return tiny_runtime


def run(rt, session, prompt=PROMPT, **overrides):
    """The page's chain: the streamed run, then last_run's figures, table and files, as one final tuple."""
    outs = list(callbacks.generate(Runtimes(rt), session, prompt, **values(**overrides)))
    return outs, (*outs[-1], *callbacks.last_run(rt, session))


@pytest.mark.parametrize("mode", ["plain", "n-gram", "self-draft", "draft model", "layer-skip"])
def test_generate_each_mode(rt, mode):
    session = Session()
    # k every round: on a random tiny model the adaptive schedule rightly makes a 16-token run all plain steps
    outs, final = run(rt, session, mode=mode, adaptive=mode == "plain")
    html, stats_html, status, itl, steps, acc, table, tokens_csv, trace, runs_csv = final
    assert "done" in status and "running" not in stats_html
    kinds = {c.removeprefix("tok-") for c in html.split('class="tok ')[1:] for c in [c.split('"')[0]]}
    assert kinds and kinds <= set(KINDS)
    if mode != "plain":
        assert kinds & {"accepted", "rejected", "resampled", "bonus"}
    assert all(isinstance(f, gr.components.Component) or hasattr(f, "to_json") for f in (itl, steps, acc))
    rows = read_csv(tokens_csv)
    assert len(rows) == html.count('class="tok ')
    assert {r["mode"] for r in rows} == {mode}
    emitted = [r for r in rows if r["kind"] != "rejected"]
    assert len(emitted) == MAX_NEW_TOKENS or rows[-1]["token_id"] in map(str, rt.engine.model.eos_ids)
    assert len(table) == 1 and table[0][1].startswith(mode)
    assert read_csv(runs_csv)[0]["run_id"] == session.history[0].run_id


def test_greedy_speculative_output_equals_plain(rt):
    def ids(mode):
        *_, tokens_csv, _, _ = run(rt, Session(), mode=mode, max_new_tokens=40)[1]
        return [r["token_id"] for r in read_csv(tokens_csv) if r["kind"] != "rejected"]

    plain = ids("plain")
    for mode in ("n-gram", "self-draft", "draft model", "layer-skip"):
        assert ids(mode) == plain, mode


def test_the_stream_goes_by_its_side_channel_and_ends_with_the_whole_html(rt):
    import time

    import gradio as gr

    from ui import stream

    session = Session()
    gen = callbacks.generate(Runtimes(rt), session, PROMPT, **values(max_new_tokens=200))
    marker, first_stats, _ = next(gen)
    token = marker.removeprefix("<!--ds-live:").removesuffix("-->")
    assert marker == stream.MARKER.format(token) and stream.LIVE[token] is not None
    assert first_stats == ""  # the page shows the live stats line the polls bring
    got, offset, outs, stats = "", 0, [], []
    for out in gen:  # the page's fetches, between the event's own (rare) updates
        outs.append(out)
        reply = stream.poll(token, offset)
        got, offset = got + reply["html"], reply["offset"]
        if reply["stats"]:
            stats.append((time.monotonic(), reply["stats"]))
    *streaming, last = outs
    # while the run streams gradio carries no tokens and no stats: updates that change nothing, and the status
    # once when the first round arrived
    skip = gr.skip()
    assert all(o[0] == skip and o[1] == skip for o in streaming)
    assert sum(o[2] != skip for o in streaming) <= 1
    assert all(isinstance(v, str) for v in last)
    final = last[0]
    assert final.startswith(got) and final.count('class="tok ') == len(session.last[0].rows())
    assert "tok/s" in last[1] and "ds-stats" in last[1]
    # the polls carried the stats line of the run so far, at most every STATS_INTERVAL_S
    assert stats and all("ds-stats" in h for _, h in stats)
    assert all(b - a >= stream.STATS_INTERVAL_S * 0.99 for (a, _), (b, _) in zip(stats, stats[1:], strict=False))
    assert len(outs) < 200 / 4  # a handful of updates, not one per token
    assert token not in stream.LIVE and stream.poll(token, offset)["done"]  # the run is gone


def test_a_page_reads_only_the_run_it_was_given(rt):
    from ui import stream

    assert stream.poll("0" * 32, 0) == dict(html="", offset=0, done=True, stats="")


BAD = [
    (dict(mode="n-gram", k=40), "k=40"),
    (dict(mode="n-gram", k=0), "k=0"),
    (dict(temperature=-1.0), "temperature=-1.0"),
    (dict(top_p=0.0), "top_p=0.0"),
    (dict(top_p=1.5), "top_p=1.5"),
    (dict(top_k=-3), "top_k=-3"),
    (dict(max_new_tokens=5000), "lower max new tokens to"),
    (dict(mode="layer-skip", layers=9), "layer-skip depth 9"),
    (dict(mode="n-gram", ngram=0), "ngram=0 is out of range; pick 1..8"),
    (dict(mode="draft model", draft_model="nope"), "'nope'"),
    (dict(mode="beam"), "mode='beam'"),
    (dict(cuda_graphs=True), "CUDA graphs are unavailable"),
    (dict(k=2.5, mode="n-gram"), "whole number"),
    (dict(temperature="hot"), "temperature='hot'"),
    # what a slider's box or an API client sends past the page's range is refused naming the range, never clamped
    (dict(mode="n-gram", k=100), "k=100 is out of range; pick 1..16"),
    (dict(k=0), "k=0 is out of range; pick 1..16"),
    (dict(max_new_tokens=0), "max_new_tokens=0 is out of range; pick 1 or more"),
    (dict(temperature=5), "temperature=5 is out of range; pick 0..2"),
    (dict(top_k=201), "top_k=201 is out of range; pick 0..200"),
    (dict(window=8), "window=8 is out of range; pick 0 (full attention) or 16..8192"),
]


@pytest.mark.parametrize("overrides,needle", BAD, ids=[n for _, n in BAD])
def test_bad_setting_is_a_gr_error_naming_it(rt, overrides, needle):
    session = Session()
    with pytest.raises(gr.Error) as e:
        run(rt, session, **overrides)
    assert needle in str(e.value.message)
    assert session.history == []
    run(rt, session)  # the engine is still free
    assert len(session.history) == 1


def assert_empty_last_run(rt, session):
    """After a run that made nothing: empty figures, the runs table as it is, no files (an API client reads these;
    a skip would fail it client-side)."""
    *figs, table, token_csv, trace, runs_csv = callbacks.last_run(rt, session)
    assert all(not fig.data for fig in figs) and (token_csv, trace, runs_csv) == (None, None, None)
    assert len(table) == len(session.history)


def test_a_refused_run_says_why_where_the_output_goes_and_clears_the_last_runs_status(rt):
    session = Session()
    run(rt, session)
    gen = callbacks.generate(Runtimes(rt), session, PROMPT, **values(mode="n-gram", k=40))
    html, stats_html, status = next(gen)
    assert "k=40" in html and "ds-error" in html  # in the output box, not a fading toast
    assert stats_html == "" and status == ""  # nothing of "Run 1 done" is left to read as this run's result
    with pytest.raises(gr.Error) as e:  # API clients still get the error
        next(gen)
    assert e.value.visible is False  # the page shows it in place
    assert_empty_last_run(rt, session)


def test_prompt_longer_than_the_cache_names_what_to_change_on_the_page(rt):
    with pytest.raises(gr.Error, match="shorten the prompt") as e:
        run(rt, Session(), prompt="x" * 3000)
    assert "max_seq_len" not in e.value.message  # a launch flag the page does not have
    room = rt.engine.max_seq_len
    n = len(rt.encode(PROMPT, False))
    with pytest.raises(gr.Error, match=f"lower max new tokens to {room - n} or shorten the prompt"):
        run(rt, Session(), max_new_tokens=room)


def test_a_formats_first_run_says_it_loads_the_weights(rt):
    rt.engines.pop("fp16", None)
    gen = callbacks.generate(Runtimes(rt), Session(), PROMPT, **values(weights="fp16", max_new_tokens=4))
    assert "Loading the fp16 weights" in next(gen)[2]
    *streaming, final = gen
    # once the weights are in and a round arrived, the status says the run is running (however fast they loaded)
    assert [o[2] for o in streaming if "Running" in str(o[2])] and "done" in final[2] and rt.loaded("fp16")
    assert "Loading" not in next(callbacks.generate(Runtimes(rt), Session(), PROMPT, **values(weights="fp16")))[2]


def test_runs_table_lists_the_newest_first(rt):
    session = Session()
    run(rt, session, seed=1)
    _, final = run(rt, session, seed=2)
    table = final[6]
    assert [row[0] for row in table] == [2, 1]


def test_empty_prompt(rt):
    with pytest.raises(gr.Error, match="prompt is empty"):
        run(rt, Session(), prompt="  ")


def test_stop_ends_the_run_within_a_round_and_keeps_it(rt):
    session = Session()
    gen = callbacks.generate(Runtimes(rt), session, PROMPT, **values(max_new_tokens=2000 - 40))
    next(gen)
    first = next(gen)  # some tokens are out
    assert first[0]
    ui_run.stop(session)
    t0 = time.monotonic()
    *_, final = gen
    assert time.monotonic() - t0 < 2
    assert "stopped after" in final[2]
    table = callbacks.last_run(rt, session)[3]
    assert session.history[0].stopped and table[0][-1] == "yes"
    assert rt.lock.acquire(timeout=2)
    rt.lock.release()
    run(rt, session)
    assert not session.history[1].stopped


def test_closing_the_generator_frees_the_engine(rt):
    """What gradio does when the tab closes or the run is cancelled: close the generator at a yield."""
    session = Session()
    gen = callbacks.generate(Runtimes(rt), session, PROMPT, **values(max_new_tokens=1900))
    next(gen), next(gen)
    gen.close()
    assert rt.lock.acquire(timeout=2)
    rt.lock.release()
    assert session.history == []
    _, final = run(rt, session)
    assert "done" in final[2]


def test_stop_while_queued_drops_the_run(rt):
    session = Session()
    ui_run.submit(session)
    ui_run.stop(session)
    outs = list(callbacks.generate(Runtimes(rt), session, PROMPT, **values()))
    assert "before it started" in outs[-1][2] and session.history == []
    assert_empty_last_run(rt, session)
    ui_run.submit(session)
    _, final = run(rt, session)  # a later run is not affected
    assert "done" in final[2]


def test_one_run_on_the_engine_at_a_time(rt):
    """Two sessions' runs started together: the second waits for the engine, both complete."""
    results, active, overlap = {}, [0], [False]
    real = rt.rounds_fn

    def watched(s, ids, *earlier):
        active[0] += 1
        overlap[0] |= active[0] > 1
        try:
            yield from real(s, ids, *earlier)
        finally:
            active[0] -= 1

    rt.rounds_fn = watched
    try:
        threads = [threading.Thread(target=lambda i=i: results.update({i: run(rt, Session(), seed=i)[1]}))
                   for i in range(2)]
        [t.start() for t in threads]
        [t.join(30) for t in threads]
    finally:
        rt.rounds_fn = real
    assert not overlap[0] and len(results) == 2


def test_live_figures_only_when_the_run_moved_on(rt):
    session = Session()
    assert callbacks.live_figures(rt, session) == (gr.skip(),) * 3  # no run
    gen = callbacks.generate(Runtimes(rt), session, PROMPT, **values(max_new_tokens=1500))
    next(gen), next(gen)
    itl, steps, acc = callbacks.live_figures(rt, session)
    assert hasattr(itl, "to_json") and steps == acc == gr.skip()  # the latency panel only, mid-run
    if session.live is not None and len(session.live.rounds) == session.live.drawn:
        assert callbacks.live_figures(rt, session) == (gr.skip(),) * 3
    ui_run.stop(session)
    list(gen)
    assert session.live is None


def test_end_session_removes_its_files(rt):
    session = Session()
    *_, tokens_csv, trace, runs_csv = run(rt, session)[1]
    folder = rt.store.root / session.history[0].run_id
    assert folder.is_dir()
    ui_run.end_session(rt, session)
    assert not folder.exists() and session.run_stop.is_set()


def test_parse_settings_converts_widget_values():
    s = parse_settings(values(k=5.0, seed=7.0, top_p="0.5", adaptive="false"))
    assert (s.k, s.sampling.seed, s.sampling.top_p, s.adaptive) == (5, 7, 0.5, False) and isinstance(s.k, int)


def test_settings_go_by_name_and_an_unknown_one_is_named(rt):
    # a setting not sent keeps the record's default: a client naming a few keeps working as settings are added
    session = Session()
    list(callbacks.generate(Runtimes(rt), session, PROMPT, max_new_tokens=3, chat=False, fused_kernels=False,
                            cuda_graphs=False))
    assert session.history[0].settings["k"] == Request().k and session.history[0].summary["tokens"] == 3
    gen = callbacks.generate(Runtimes(rt), Session(), PROMPT, max_new_tokens=3, nonsense=1)
    html = next(gen)[0]
    assert "unknown setting &#x27;nonsense&#x27;" in html and "max_new_tokens" in html  # names the settings
    with pytest.raises(gr.Error):
        next(gen)


def test_engine_side_takes_and_yields_plain_records(rt):
    """On ZeroGPU the arguments and every yielded record cross a process boundary by pickle."""
    import pickle

    s = parse_settings(values(mode="n-gram", max_new_tokens=8))
    ids = rt.encode(PROMPT, chat=False)
    pickle.dumps((s, ids))
    records = list(rt.rounds_fn(s, ids))
    assert repr(pickle.loads(pickle.dumps(records))) == repr(records)  # repr: NaN == NaN
    assert [type(r).__name__ for r in (records[0], records[-1])] == ["RunFacts", "RunFacts"]

    def plain(x):  # nothing of torch crosses back: no tensor, no device object
        if dataclasses.is_dataclass(x):
            return all(plain(getattr(x, f.name)) for f in dataclasses.fields(x))
        if isinstance(x, (list, tuple)):
            return all(map(plain, x))
        if isinstance(x, dict):
            return all(plain(k) and plain(v) for k, v in x.items())
        return isinstance(x, (str, int, float, bool, type(None)))

    assert all(plain(r) for r in records)
