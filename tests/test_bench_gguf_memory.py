"""bench/gguf_memory.py's figures from scripted children (no file is made, nothing is timed): the row's medians and
ratios, and each run set against the probes either side of it, so a run is never judged by a probe taken minutes
away on a box whose bandwidth drifts, nor by its neighbour's."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from bench import gguf_memory, random_gguf

STEP_BYTES = 2e9  # a step's reads: 2 GB, so tok/s x 2 is GB/s


def scripted(monkeypatch, tmp_path, probes: list[float], ours: list[float], bench: list[float], real=None,
             delete_files=False) -> dict:
    """A row from children that answer from the lists; real: a real file's row (no random file is made)."""
    path = tmp_path / "file.gguf"
    path.write_bytes(b"x" * 1000)
    monkeypatch.setattr(random_gguf, "kquant_file", lambda shape, folder: path if real is None else 1 / 0)
    probes, ours, bench = list(probes), list(ours), list(bench)
    order = []

    def in_child(kind, *args):
        order.append(kind)
        if kind == "probe":
            return dict(gbs=probes.pop(0))
        if kind == "bench":
            return dict(tg_tok_s=bench.pop(0), peak_rss=900, tg_test="tg32@d32")
        out = dict(load_s=1.0, notes="", peak_rss=1200, kv_bytes=100, packed_bytes=990, cache_bytes=10)
        if args[-1] == "decode":
            tok_s = ours.pop(0)
            out.update(tok_s=tok_s, mean_tok_s=0.9 * tok_s, step_bytes=STEP_BYTES)  # a few slower steps
        return out

    monkeypatch.setattr(gguf_memory, "in_child", in_child)
    args = argparse.Namespace(folder=str(tmp_path), prompt_len=32, new_tokens=32, repeats=3, threads=2,
                              delete_files=delete_files)
    baseline = dict(peak_rss=250, rss_file=80)
    row = (gguf_memory.row("1.5B", args, baseline) if real is None
           else gguf_memory.row(real.name, args, baseline, real))
    assert order == ["probe", "ours"] + ["ours", "probe", "bench", "probe"] * 3 and not probes
    return row


def test_each_run_is_set_against_the_probes_around_it(monkeypatch, tmp_path):
    # probes: p0 | ours 10 | p1 | bench 8 | p2 | ours 12 | p3 | bench 9 | p4 | ours 11 | p5 | bench 7 | p6
    probes = [25.0, 30.0, 40.0, 20.0, 30.0, 50.0, 25.0]
    row = scripted(monkeypatch, tmp_path, probes, ours=[10.0, 12.0, 11.0], bench=[8.0, 9.0, 7.0])
    assert row["ours_tok_s"] == 11.0 and row["bench_tg_tok_s"] == 8.0
    assert row["ours_over_bench"] == pytest.approx(11 / 8)
    # paired: each run's mean rate against the llama-bench run after it: 9 / 8, 10.8 / 9, 9.9 / 7
    assert row["ours_mean_tok_s"] == pytest.approx(9.9)
    assert row["ours_over_bench_paired"] == pytest.approx(10.8 / 9)
    assert row["paired_lo"] == pytest.approx(9 / 8) and row["paired_hi"] == pytest.approx(9.9 / 7)
    assert row["bandwidth_gbs"] == 50.0 and row["probes_gbs"] == probes
    assert row["ours_pct_of_bandwidth"] == pytest.approx(100 * 22 / 50)
    # ours: 20 GB/s against max(25, 30), 24 against max(40, 20), 22 against max(30, 50)
    assert row["ours_pct_of_near_probes"] == pytest.approx(100 * 24 / 40)  # the median of 66.7, 60, 44
    # llama-bench: 16 against max(30, 40), 18 against max(20, 30), 14 against max(50, 25)
    assert row["bench_pct_of_near_probes"] == pytest.approx(100 * 16 / 40)  # the median of 40, 60, 28
    assert row["rss_over_file_plus_kv"] == pytest.approx(1200 / 1100)
    assert row["baseline_rss_gb"] == 250 / 1e9 and row["baseline_file_gb"] == 80 / 1e9


def test_a_steady_box_gives_the_same_figure_both_ways(monkeypatch, tmp_path):
    row = scripted(monkeypatch, tmp_path, [40.0] * 7, ours=[15.0, 16.0, 14.0], bench=[10.0] * 3)
    assert row["ours_pct_of_near_probes"] == pytest.approx(row["ours_pct_of_bandwidth"]) == pytest.approx(75.0)
    assert row["bench_pct_of_near_probes"] == pytest.approx(50.0)
    assert "ours_pct_of_near_probes" in gguf_memory.markdown(dict(repeats=3, new_tokens=32, prompt_tokens=32,
                                                                  threads=2, rows=[row]))


def test_a_real_file_is_measured_as_it_is_and_never_deleted(monkeypatch, tmp_path):
    """--files: a user's file gets the same row, named by its file, and --delete-files (for the random files the
    bench makes) leaves it alone."""
    real = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    real.write_bytes(b"y" * 3000)
    row = scripted(monkeypatch, tmp_path, [40.0] * 7, ours=[15.0] * 3, bench=[10.0] * 3, real=real,
                   delete_files=True)
    assert real.exists() and row["shape"] == real.name and row["like"] == "a real file"
    assert row["file_gb"] == 3000 / 1e9 and row["rss_over_file_plus_kv"] == pytest.approx(1200 / 3100)


@pytest.fixture
def a_large_parent():
    """This process holding 1 GiB more, every page touched: what a child's peak must not include."""
    held = bytearray(2**30)
    held[::4096] = b"\x01" * len(held[::4096])
    yield held


def test_a_child_reports_its_own_peak_not_its_parents(a_large_parent):
    """Linux carries the spawning process's RSS into a child's getrusage ru_maxrss across exec; VmHWM starts
    afresh, so a child of a large benchmark process reports its own size (importing the bench: ~300 MB), and
    so does the peak memory a run's stats show (an app started by a large process)."""
    code = ("import torch; from bench.gguf_memory import peak_rss; from engine.timing import Clock; "
            "print(peak_rss(), Clock(torch.device('cpu')).peak_memory_mb())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    bench_peak, stats_peak_mb = done.stdout.split()
    assert 0 < int(bench_peak) < 640 * 2**20
    assert 0 < float(stats_peak_mb) < 640


def test_a_watched_command_reports_its_own_peak(a_large_parent):
    """llama-bench's peak: its own VmHWM read until it exits, whatever the process that started it holds."""
    code = "import time; b = bytearray(200 * 2**20); b[::4096] = b'\\x01' * len(b[::4096]); time.sleep(0.3)"
    done, peak = gguf_memory.run_watched([sys.executable, "-c", code], dict(os.environ))
    assert done.returncode == 0
    assert 200 * 2**20 < peak < 320 * 2**20
