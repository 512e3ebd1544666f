"""Phi-3 against transformers (tests/family_checks.py): q, k, v in one qkv_proj and gate, up in one gate_up_proj
(taken as our merged projections are), and a sliding window on every layer."""
import pytest

from engine.config import ConfigError
from engine.tiny import tiny_config
from family_checks import (check_formats_match_their_twins, check_greedy, check_speculative, check_windows_matter,
                           run_all)


def test_phi3(tmp_path):
    cfg = tiny_config("phi3")
    folder = run_all(cfg, tmp_path)
    check_windows_matter(folder, cfg, tmp_path, by_layer_types=False)
    check_formats_match_their_twins(folder, cfg)
    check_greedy(folder, cfg)
    check_speculative(folder, cfg)


def test_long_context_scaling_is_refused():
    with pytest.raises(ConfigError, match="rope scaling 'longrope' is not supported"):
        tiny_config("phi3", rope_scaling=dict(rope_type="longrope", short_factor=[1.0] * 8, long_factor=[2.0] * 8))
