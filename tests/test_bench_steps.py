"""bench/steps.py: a timed step and verify pass read their greedy ids as the engine's own loops do, and a
--baseline tree is timed by this tree's timing code."""
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench import steps
from engine import Engine, load_model
from engine.tiny import tiny_config, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    folder = write_tiny_model(tmp_path_factory.mktemp("tiny") / "m", tiny_config(), seed=0)
    return Engine(load_model(str(folder), weights="q4_a8", progress=lambda msg: None), max_seq_len=64)


@torch.inference_mode()
def test_the_picks_are_each_rows_argmax_as_the_engine_reads_them(eng):
    eng.prefill(list(range(20, 40)))
    logits = eng.decode(torch.tensor([7]))
    assert steps.greedy_ids(eng, logits).tolist() == logits.argmax(-1).tolist()
    rows = eng.chunk(torch.tensor([[3, 1, 4, 1, 5, 9]]))[0]
    assert steps.greedy_ids(eng, rows).tolist() == rows.argmax(-1).tolist()
    # a baseline tree's engine without a host pick: torch's argmax, as its own loops read them
    assert steps.greedy_ids(SimpleNamespace(), rows).tolist() == rows.argmax(-1).tolist()


def test_step_and_verify_timings_run_on_the_engine(eng):
    out = steps.verify_costs(eng, list(range(20, 52)), ts=(1, 3), steps=3, rounds=1)
    assert out["step_ms"] > 0 and out["verify3_ms"] > 0 and out["verify3_over_step"] > 0


def test_the_baseline_script_carries_this_trees_timing_code():
    """MEASURE runs in another tree with that tree's engine but these functions, so both trees are timed alike."""
    for f in steps.TIMING:
        assert f"def {f.__name__}(" in steps.MEASURE
    assert "from bench" not in steps.MEASURE  # nothing of the other tree's bench/
    compile(steps.MEASURE, "MEASURE", "exec")


def test_the_baseline_script_runs_in_a_tree():
    """A tree's run of MEASURE (here this tree's own, the default model): its row of step and verify costs."""
    from bench.common import in_tree

    row = in_tree(ROOT, steps.MEASURE, ["q4_a8", "1,2", "32", "1", str(steps.TEXT)])
    assert row["step_ms"] > 0 and row["verify2_over_step"] > 0 and row["weight_bytes"] > 0
