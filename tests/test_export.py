import json
import math

import pytest

from engine.stats import EMITTED_KINDS
from ui import export
from ui.testing import synthetic_stats, text_of
from runtimes import read_csv


def test_token_csv_round_trip(tmp_path):
    s = synthetic_stats(15, k=4, seed=2, temperature=0.0, top_p=1.0, seed_=0)
    path = export.write_tokens_csv(tmp_path / "t.csv", "run-3", s, text_of)
    rows = read_csv(path)
    assert set(export.TOKEN_COLUMNS + ["mode", "k", "temperature", "top_p"]) <= set(rows[0])
    assert len(rows) == sum(len(r.tokens) for r in s.rounds)
    emitted = [r for r in rows if r["kind"] in EMITTED_KINDS]
    assert [int(r["token_id"]) for r in emitted] == s.ids
    assert [int(r["token_index"]) for r in emitted] == list(range(len(s.ids)))
    assert all(r["token_index"] == "" and r["latency_ms"] == "" for r in rows if r["kind"] == "rejected")
    assert {r["run_id"] for r in rows} == {"run-3"}
    assert [r["token_text"] for r in rows] == [text_of(int(r["token_id"])) for r in rows]
    assert {r["mode"] for r in rows} == {"n-gram"} and {r["k"] for r in rows} == {"4"}
    lat = [float(r["latency_ms"]) for r in emitted[1:]]
    assert lat == pytest.approx(s.token_latencies_ms(), rel=1e-5)  # 6 significant digits


def test_token_text_with_commas_quotes_and_newlines_survives(tmp_path):
    s = synthetic_stats(4)
    odd = 'a,"b"\nc'
    rows = read_csv(export.write_tokens_csv(tmp_path / "t.csv", "r", s, lambda i: odd))
    assert {r["token_text"] for r in rows} == {odd}


def test_runs_csv(tmp_path):
    rows = [
        export.summary_row("run-1", "plain", synthetic_stats(10).summary(), {"mode": "plain"}),
        export.summary_row("run-2", "n-gram", synthetic_stats(10, k=3).summary(), {"mode": "n-gram", "k": 3}),
    ]
    got = read_csv(export.write_runs_csv(tmp_path / "runs.csv", rows))
    assert [r["run_id"] for r in got] == ["run-1", "run-2"]
    assert set(export.SUMMARY_COLUMNS) <= set(got[0])
    assert float(got[1]["decode_tok_s"]) == pytest.approx(rows[1]["decode_tok_s"])
    assert got[1]["k"] == "3"


def test_chrome_trace_is_valid_and_covers_every_round(tmp_path):
    s = synthetic_stats(12, k=4)
    path = export.write_trace(tmp_path / "trace.json", "run-1", s)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in spans)
    rounds = [e for e in spans if e["name"] == "round"]
    assert len(rounds) == len(s.rounds)
    assert rounds[-1]["ts"] + rounds[-1]["dur"] == pytest.approx(s.rounds[-1].t_end_ms * 1e3, abs=0.01)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == set(export.TRACE_LANES)
    phases = sum(e["dur"] for e in spans if e["name"] != "round")
    assert phases == pytest.approx(sum(e["dur"] for e in rounds), rel=1e-6)


def test_trace_has_no_nan(tmp_path):
    s = synthetic_stats(3)
    s.settings["weird"] = math.nan
    text = export.write_trace(tmp_path / "t.json", "r", s).read_text()
    json.loads(text)
    assert "NaN" not in text


def test_store_keeps_newest_and_cleans_up(tmp_path):
    store = export.ExportStore(keep=2, root=tmp_path)
    dirs = [store.run_dir(f"run-{i}") for i in range(3)]
    for d in dirs[1:]:
        (d / "x.csv").write_text("x")
    assert not dirs[0].exists() and dirs[1].exists() and dirs[2].exists()
    store.drop(["run-1"])
    assert not dirs[1].exists()
    store.close()
    assert not store.root.exists()


def compare_like_history():
    """A plain run, a speculative run compared against it (its speedup set the way Compare sets it), and a
    speculative run whose every draft was rejected (acceptance 0, not missing)."""
    import dataclasses

    from engine.request import Request
    from engine.stats import Token

    def run(mode, k=0, seed=0):
        stats = synthetic_stats(12, k=k, seed=seed)
        stats.settings.update(Request(mode=mode, k=3, weights="q4").as_dict("m"))  # what the page records
        return stats

    plain = run("plain")
    spec = dataclasses.replace(run("n-gram", 3, 5), baseline_tok_s=plain.summary()["decode_tok_s"])
    rejected = run("n-gram", 3, 6)
    for r in rejected.rounds[1:]:
        r.tokens = [Token(1, "rejected", 0, 0.2, 1.0), Token(2, "resampled", None, 0.5)]
    return [("run-1", "plain", plain, {}), ("run-2", "compare: n-gram", spec, {"speedup_over": "plain"}),
            ("run-3", "n-gram", rejected, {})]


def test_runs_csv_every_column_read_back_with_pandas(tmp_path):
    """One convention (an empty cell for a missing value, never 'nan'), and every column filled where its run
    has the value: prompt_tokens always, speedup for a compared run, acceptance for a speculative one (0 too),
    the bandwidth share for a plain one only."""
    import pandas as pd

    history = compare_like_history()
    rows = [export.summary_row(i, label, {**s.summary(), **extra}, s.settings) for i, label, s, extra in history]
    path = export.write_runs_csv(tmp_path / "runs.csv", rows)
    assert "nan" not in path.read_text().lower()
    df = pd.read_csv(path).set_index("run_id")
    empty = {  # (column, run) pairs that have no value; every other cell must be filled
        ("acceptance_rate", "run-1"), ("mean_accepted_len", "run-1"), ("draft_overhead_pct", "run-1"),
        ("mean_k", "run-1"), ("plain_round_pct", "run-1"), ("speedup", "run-1"), ("speedup", "run-3"),
        ("speedup_over", "run-1"), ("speedup_over", "run-3"), ("pct_of_ceiling", "run-2"),
        ("pct_of_ceiling", "run-3"),
    }
    unset = ("draft_model", "endpoint", "endpoint_model")  # "" in these runs' settings: an empty cell
    for column in export.SUMMARY_COLUMNS[1:] + [c for c in export.SETTINGS_COLUMNS if c not in unset]:
        for run in df.index:
            filled = not pd.isna(df.loc[run, column])
            assert filled == ((column, run) not in empty), (column, run, df.loc[run, column])
    assert df.loc["run-1", "prompt_tokens"] == 7
    assert df.loc["run-3", "acceptance_rate"] == 0
    assert df.loc["run-2", "speedup"] == pytest.approx(history[1][2].summary()["speedup"])


def test_token_csv_every_column_read_back_with_pandas(tmp_path):
    import pandas as pd

    _, _, spec, _ = compare_like_history()[1]
    path = export.write_tokens_csv(tmp_path / "t.csv", "run-2", spec, text_of)
    assert "nan" not in path.read_text().lower()
    df = pd.read_csv(path, keep_default_na=False, na_values=[""])
    drafts = df["kind"].isin(["accepted", "rejected"])
    none = df["round"] < 0
    rule = {  # column -> the rows that have a value (True: all of them)
        "round_k": df["round"] > 0, "token_index": df["kind"] != "rejected", "latency_ms": df["kind"] != "rejected",
        "draft_position": drafts, "p_draft": drafts, "draft_model": none,  # n-gram has no draft model
        "endpoint": none, "endpoint_model": none,  # this engine's run, not an endpoint's
    }
    for column in df.columns:
        want = rule.get(column, True)
        has = df[column].notna()
        assert (has == want).all() if not isinstance(want, bool) else has.all(), column
    assert set(df["prompt_tokens"]) == {spec.prompt_len}


def test_csv_figures_are_rounded_and_the_drafter_named_once(tmp_path):
    s = synthetic_stats(10, k=3)
    settings = {"drafter": "ngram", **s.settings}
    row = export.summary_row("run-1", "n-gram", s.summary(), settings)
    text = export.write_runs_csv(tmp_path / "runs.csv", [row]).read_text()
    assert "drafter" not in text.splitlines()[0] and "n-gram" in text
    numbers = [c for c in text.splitlines()[1].split(",") if "." in c and c.replace(".", "").isdigit()]
    assert numbers and max(len(c.replace(".", "").lstrip("0")) for c in numbers) <= 6
    assert export.cell(24.691358024691358) == 24.6914 and export.cell(float("nan")) is None
