"""bench/paired_decode.py: llama-server's timings read as steps after the first token, and a whole row on the default
model's GGUF file against the real llama-server and llama-bench (where scripts/build_llamacpp.sh built them)."""
from __future__ import annotations

import argparse
import json
import statistics

import httpx
import pytest

from bench import llamacpp, paired_decode
from engine.checkpoint import default_model
from engine.endpoint import llamacpp as server


def test_server_burst_counts_the_steps_after_the_first_token():
    """llama-server's clock starts at the first token, which its predicted_n counts: 17 tokens in 320 ms are 16 steps,
    50 tok/s (its own predicted_per_second would say 53.1)."""
    asked = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content))
        return httpx.Response(200, json={"timings": {"predicted_n": 17, "predicted_ms": 320.0,
                                                     "predicted_per_second": 1e3 * 17 / 320.0}})

    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        assert paired_decode.server_burst(client, "http://srv", [1, 2, 3], 16) == pytest.approx(50.0)
        assert asked[0]["n_predict"] == 17 and asked[0]["ignore_eos"] and asked[0]["prompt"] == [1, 2, 3]
        with pytest.raises(RuntimeError, match="predicted 17 tokens, 9 asked"):
            paired_decode.server_burst(client, "http://srv", [1, 2, 3], 8)


@pytest.mark.slow
@pytest.mark.skipif(server.binary() is None or llamacpp.bench_binary() is None,
                    reason="llama-server (LLAMA_SERVER) and llama-bench (scripts/build_llamacpp.sh) are needed")
def test_a_row_pairs_each_cycle_on_the_default_file():
    path = default_model.gguf_path(progress=lambda msg: None)
    args = argparse.Namespace(cycles=3, tokens=4, prompt_len=8, threads=1, kv_cache="auto")
    r = paired_decode.row("default", path, args)
    assert {k: len(v) for k, v in r["runs"].items()} == {"ours": 3, "server": 3, "bench": 3}
    assert all(v > 0 for runs in r["runs"].values() for v in runs)
    ratios = [o / b for o, b in zip(r["runs"]["ours"], r["runs"]["bench"], strict=True)]
    assert r["ours_over_bench"] == dict(median=statistics.median(ratios), lo=min(ratios), hi=max(ratios))
    assert r["ours_tok_s"] == statistics.median(r["runs"]["ours"]) and r["kv_cache"] == "float16"  # auto
    md = paired_decode.markdown(dict(rows=[r], cycles=3, tokens=4, prompt_tokens=8, threads=1))
    assert "| default |" in md and f"{r['ours_over_bench']['median']:.3f}" in md


def test_kind_picks_the_random_files_mix(tmp_path, monkeypatch):
    """--kind makes the random files in another of llama-quantize's mixes, and names it in the row."""
    made = []
    monkeypatch.setattr(paired_decode.random_gguf, "kquant_file",
                        lambda shape, folder, kind: made.append((shape, kind)) or tmp_path / f"{shape}-{kind}.gguf")
    ratio = dict(median=2.0, lo=1.9, hi=2.1)
    monkeypatch.setattr(paired_decode, "row", lambda name, path, args: dict(
        file=name, file_gb=0.8, ours_tok_s=30.0, server_tok_s=15.0, bench_tok_s=15.0, ours_over_bench=ratio,
        ours_over_server=ratio, server_over_bench=ratio, ours_ahead_of_bench=1.0))
    paired_decode.main(["--kind", "Q3_K_M", "--shapes", "1.5B", "--out", str(tmp_path), "--name", "pd"])
    assert made == [("1.5B", "Q3_K_M")]
    assert "| random 1.5B Q3_K_M |" in (tmp_path / "pd.md").read_text()
    made.clear()  # files alone: no random shape beside them unless one is named
    paired_decode.main(["--files", str(tmp_path / "real.gguf"), "--out", str(tmp_path), "--name", "pd"])
    assert made == [] and "| real.gguf |" in (tmp_path / "pd.md").read_text()
    paired_decode.main(["--out", str(tmp_path), "--name", "pd"])
    assert made == [("1.5B", "Q4_K_M")]
    with pytest.raises(SystemExit):
        paired_decode.main(["--kind", "IQ4_XS", "--out", str(tmp_path)])
