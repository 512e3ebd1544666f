import csv
import json
import math

import pytest

from engine.stats import EMITTED_KINDS
from ui import export
from ui.testing import synthetic_stats, text_of


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


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
    assert lat == pytest.approx(s.token_latencies_ms())


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
