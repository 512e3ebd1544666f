"""Qwen2 / Qwen2.5 against transformers (tests/family_checks.py): q/k/v biases, and the sliding window on the
layers from max_window_layers on when use_sliding_window is set."""
from engine import load_model
from engine.tiny import tiny_config
from family_checks import (check_formats_match_their_twins, check_greedy, check_speculative, check_windows_matter,
                           run_all)


def test_qwen2(tmp_path):
    cfg = tiny_config("qwen2", num_attention_heads=6, num_key_value_heads=2, hidden_size=96)
    folder = run_all(cfg, tmp_path)
    model = load_model(folder)
    assert model.layers[0].attn.wqkv.bias is not None and model.layers[0].attn.wqkv.bias.abs().sum() > 0
    check_formats_match_their_twins(folder, cfg)
    check_greedy(folder, cfg)
    check_speculative(folder, cfg)


def test_qwen2_sliding_layers(tmp_path):
    cfg = tiny_config("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert cfg.layer_types == ("full_attention",) * 2 + ("sliding_attention",) * 2
    folder = run_all(cfg, tmp_path)
    check_windows_matter(folder, cfg, tmp_path)


def test_biases_are_qwen2s_whatever_attention_bias_says():
    assert tiny_config("qwen2", attention_bias=False).attention_bias  # transformers' Qwen2 always has them
    assert not tiny_config("qwen3").attention_bias
