"""Per-token CSV, per-run summary CSV and a Chrome trace (Perfetto-loadable) of the step timeline.

One convention in both CSVs: a value a row does not have is an empty cell (never "nan"), so pandas reads it
as missing and a spreadsheet shows a blank. Files go to one folder per run under a temporary root that the
app owns (ExportStore): the store keeps the newest runs only, a closed session drops its own, and the root
goes when the app exits.
"""
from __future__ import annotations

import csv
import json
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from engine.request import NAMES
from engine.stats import PHASES, Stats, finite

TOKEN_COLUMNS = [
    "run_id", "round", "round_k", "token_index", "token_id", "token_text", "kind", "draft_position",
    "latency_ms", "p_target", "p_draft", "round_ms", "draft_ms", "target_ms", "sample_ms", "t_end_ms", "inferred",
    "prompt_tokens",
]
# The settings a run was asked for (the request record's, in its order), repeated on every row so a CSV stands
# alone.
SETTINGS_COLUMNS = list(NAMES)
SUMMARY_COLUMNS = [
    "run_id", "label", "tokens", "prompt_tokens", "rounds", "ttft_ms", "itl_mean_ms", "itl_p50_ms",
    "itl_p99_ms", "decode_tok_s", "total_ms", "peak_memory_mb", "acceptance_rate", "mean_accepted_len",
    "draft_overhead_pct", "mean_k", "plain_round_pct", "bandwidth_ceiling_tok_s", "pct_of_ceiling", "speedup",
    "speedup_over",
]
# A speculative round streams the weights once per verify pass and the drafter's besides, so its decode tok/s
# over the one-step ceiling is no share of anything: left empty for speculative runs (the page does the same).
PLAIN_ONLY = ("pct_of_ceiling",)


# A spreadsheet runs a cell that starts with one of these as a formula (`=HYPERLINK(...)`, `=cmd|...`): OWASP's
# CSV-injection advice is a leading quote, which the spreadsheet shows as text and hides.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cell(value):
    """A CSV cell: missing, NaN and infinite figures are empty; a figure to 6 significant digits (the clocks and
    the runs' noise leave nothing in a 15-digit float's tail); text that a spreadsheet would run as a formula is
    quoted (FORMULA_START); everything else as it is."""
    if isinstance(value, float):
        return None if (x := finite(value)) is None else float(f"{x:.6g}")
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value
TRACE_LANES = ("round", *PHASES)


def _settings_columns(settings: dict) -> list[str]:
    # "drafter" is the drafter's own name for what "mode" says already: one name per thing
    return SETTINGS_COLUMNS + sorted(k for k in settings if k not in SETTINGS_COLUMNS and k != "drafter")


def token_text(row: dict, text_of: Callable[[int], str]) -> str:
    return row["text"] if row.get("text") is not None else text_of(row["token_id"])


def token_rows(run_id: str, stats: Stats, text_of: Callable[[int], str]) -> list[dict]:
    # an endpoint's tokens carry the text the server sent (their ids may not be ours)
    return [
        {k: cell(v) for k, v in dict(row, run_id=run_id, token_text=token_text(row, text_of),
                                     **{**stats.settings, "prompt_tokens": stats.prompt_len}).items()}
        for row in stats.rows()
    ]


def write_tokens_csv(path: str | Path, run_id: str, stats: Stats, text_of: Callable[[int], str]) -> Path:
    path = Path(path)
    columns = TOKEN_COLUMNS + _settings_columns(stats.settings)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(token_rows(run_id, stats, text_of))
    return path


def summary_row(run_id: str, label: str, summary: dict, settings: dict) -> dict:
    """One run of the history: its summary's figures, then the settings it was asked for (which never overwrite a
    figure: a setting and a figure of the same name keep the figure)."""
    row = {k: summary.get(k) for k in SUMMARY_COLUMNS}
    row.update(run_id=run_id, label=label)
    if settings.get("mode", "plain") != "plain":
        row.update(dict.fromkeys(PLAIN_ONLY))
    row.update({k: settings.get(k) for k in _settings_columns(settings) if k not in row})
    return {k: cell(v) for k, v in row.items()}


def write_runs_csv(path: str | Path, rows: list[dict]) -> Path:
    """The session's run history: one row per run (summary_row dicts)."""
    path = Path(path)
    columns = list(SUMMARY_COLUMNS)
    for row in rows:
        columns += [k for k in row if k not in columns]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    return path


def chrome_trace(run_id: str, stats: Stats) -> dict:
    """Trace Event Format: one complete ('X') event per round and per phase, microseconds, one thread per lane."""
    events: list[dict] = [
        dict(ph="M", pid=1, name="process_name", args=dict(name=f"decodescope run {run_id}")),
    ]
    events += [dict(ph="M", pid=1, tid=i, name="thread_name", args=dict(name=lane))
               for i, lane in enumerate(TRACE_LANES)]
    tid = {lane: i for i, lane in enumerate(TRACE_LANES)}

    def span(lane: str, start_ms: float, dur_ms: float, args: dict) -> dict:
        return dict(ph="X", pid=1, tid=tid[lane], name=lane, cat="decode",
                    ts=round(start_ms * 1e3, 3), dur=round(dur_ms * 1e3, 3), args=args)

    for r in stats.rounds:
        args = dict(round=r.index, emitted=len(r.emitted), drafted=r.n_drafted, accepted=r.n_accepted)
        events.append(span("round", r.t_start_ms, r.total_ms, args))
        events += [span(phase, start, ms, {"round": r.index}) for phase, start, ms in r.phases()]
    meta = {k: finite(v) if isinstance(v, float) else v for k, v in stats.settings.items()
            if isinstance(v, (str, int, float, bool, type(None)))}
    return dict(traceEvents=events, displayTimeUnit="ms", otherData=dict(run_id=run_id, **meta))


def write_trace(path: str | Path, run_id: str, stats: Stats) -> Path:
    path = Path(path)
    trace = chrome_trace(run_id, stats)
    # NaN is not JSON; Perfetto rejects it.
    path.write_text(json.dumps(trace, allow_nan=False, default=str), encoding="utf-8")
    return path


class ExportStore:
    """A temporary root with one folder per run; the newest `keep` folders survive, the rest are removed."""

    def __init__(self, keep: int = 64, root: str | Path | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="decodescope-", dir=root))
        self.keep = keep
        self._dirs: OrderedDict[str, Path] = OrderedDict()
        self._lock = threading.Lock()

    def run_dir(self, run_id: str) -> Path:
        with self._lock:
            d = self.root / run_id
            d.mkdir(parents=True, exist_ok=True)
            self._dirs[run_id] = d
            self._dirs.move_to_end(run_id)
            while len(self._dirs) > self.keep:
                _, old = self._dirs.popitem(last=False)
                shutil.rmtree(old, ignore_errors=True)
            return d

    def drop(self, run_ids) -> None:
        with self._lock:
            for run_id in run_ids:
                if (d := self._dirs.pop(run_id, None)) is not None:
                    shutil.rmtree(d, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._dirs.clear()
            shutil.rmtree(self.root, ignore_errors=True)
