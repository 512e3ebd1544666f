"""bench/first_token.py on the default model, a quick grid: every mode timed on every prompt after the warm-up
repeat, layer skip sharing its calibration's forward with the prefill and the other drafter not."""
import json

from bench import first_token


def test_first_token_bench_times_each_mode_and_shares_the_prefill_in_one(tmp_path):
    first_token.main(["--prompts", "2", "--repeats", "1", "--out", str(tmp_path), "--name", "t"])
    result = json.loads((tmp_path / "t.json").read_text())
    rows = {r["mode"]: r for r in result["rows"]}
    assert set(rows) == {"plain", "layer_skip", "layer_skip_two_prefills"}
    assert all(r["runs"] == 2 and 0 < r["lo"] <= r["ttft_ms"] <= r["hi"] for r in rows.values())
    assert rows["layer_skip"]["over_shared"] == 1.0
    assert result["calibration_prefilled"] == {"layer_skip": ["True"], "layer_skip_two_prefills": ["False"]}
    assert "over_shared" in (tmp_path / "t.md").read_text()
