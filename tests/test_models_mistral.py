"""Mistral against transformers (tests/family_checks.py): the sliding window on every layer, honoured in the
prefill and in the cached paths (our window mode without sinks)."""
from engine import load_model
from engine.tiny import tiny_config, write_tiny_model
from family_checks import (check_formats_match_their_twins, check_greedy, check_speculative, check_windows_matter,
                           run_all)


def test_mistral(tmp_path):
    cfg = tiny_config("mistral")
    assert cfg.layer_types == ("sliding_attention",) * 4 and cfg.sliding_window == 8
    folder = run_all(cfg, tmp_path)
    check_windows_matter(folder, cfg, tmp_path, by_layer_types=False)
    check_formats_match_their_twins(folder, cfg)
    check_greedy(folder, cfg)
    check_speculative(folder, cfg)


def test_a_config_without_sliding_window_slides_as_transformers_does(tmp_path):
    """MistralConfig's default window is 4096: a config.json without the key gets it; one with null has none."""
    assert tiny_config("mistral", sliding_window=None).sliding_window == 0
    cfg = tiny_config("mistral")
    source = {k: v for k, v in cfg.to_hf_dict().items() if k != "sliding_window"}
    from engine.config import ModelConfig

    assert ModelConfig.from_dict(source).sliding_window == 4096
    assert load_model(write_tiny_model(tmp_path / "m", cfg)).layers[0].attn.window == 8
