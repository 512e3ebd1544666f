"""Llama 2 / 3.x against transformers (tests/family_checks.py): GQA, tied embeddings, every rope scaling we run
in both config.json forms (transformers 5 keeps rope_theta and the scaling under rope_parameters: read as the old
form, a Llama 3 config would silently lose its scaling), and what we refuse."""
import json

import pytest
import torch

from engine import Engine, ModelLoadError, load_model
from engine.config import ConfigError, ModelConfig
from engine.tiny import tiny_config, write_tiny_model
from family_checks import (check_formats_match_their_twins, check_greedy, check_logits, check_speculative,
                           ref_logits, reference, prompt, run_all)

LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)
CASES = {
    "gqa": dict(num_attention_heads=8, num_key_value_heads=2),
    "tied": dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96, tie_word_embeddings=True),
    "llama3-rope": dict(rope_scaling=LLAMA3, rope_theta=500000.0),
    "llama3-rope-v5": dict(rope_parameters=LLAMA3 | {"rope_theta": 500000.0}),
    "linear-rope-v5": dict(head_dim=32, rope_parameters=dict(rope_type="linear", factor=2.0, rope_theta=10000.0)),
    "dynamic-rope": dict(rope_scaling=dict(rope_type="dynamic", factor=2.0)),
}


@pytest.mark.parametrize("case", CASES)
def test_logits_match_transformers(tmp_path, case):
    run_all(tiny_config("llama", **CASES[case]), tmp_path)


def test_formats_greedy_and_speculative(tmp_path):
    cfg = tiny_config("llama", num_attention_heads=8, num_key_value_heads=2, rope_scaling=LLAMA3)
    folder = write_tiny_model(tmp_path / "m", cfg, seed=2)
    check_formats_match_their_twins(folder, cfg)
    check_greedy(folder, cfg)
    check_speculative(folder, cfg)


def test_both_config_forms_read_the_same():
    old = tiny_config("llama", rope_theta=500000.0, rope_scaling=LLAMA3)
    new = tiny_config("llama", rope_parameters=LLAMA3 | {"rope_theta": 500000.0})
    assert old.rope == new.rope and old.rope.kind == "llama3" and old.rope.theta == 500000.0


def test_the_v5_form_is_not_read_as_the_old_one(tmp_path):
    """The bug this reading fixes: a v5 Llama 3 config read for top-level keys alone runs the default rope and
    10000 theta, and its logits are off; transformers and we both read rope_parameters."""
    cfg = tiny_config("llama", rope_parameters=LLAMA3 | {"rope_theta": 500000.0})
    folder = write_tiny_model(tmp_path / "v5", cfg, seed=3)
    ids = prompt(cfg)
    want = ref_logits(reference(folder), ids)
    plain = tmp_path / "plain"
    write_tiny_model(plain, tiny_config("llama"), seed=3)  # the same weights with no scaling at all
    assert (ref_logits(reference(plain), ids) - want).abs().max() > 1e-2
    torch.testing.assert_close(Engine(load_model(folder), 128).logits(ids), want, atol=1e-4, rtol=1e-4)


def test_dynamic_rope_is_exact_only_up_to_the_trained_length(tmp_path):
    cfg = tiny_config("llama", max_position_embeddings=64, rope_scaling=dict(rope_type="dynamic", factor=2.0))
    model = load_model(write_tiny_model(tmp_path / "m", cfg))
    Engine(model, max_seq_len=64)
    with pytest.raises(ConfigError, match="'dynamic' is exact up to the trained 64 positions.*max_seq_len <= 64"):
        Engine(model, max_seq_len=65)


@pytest.mark.parametrize("change, words", [
    (dict(model_type="gpt2"), r"model_type='gpt2'.*llama \(Llama 2 / 3.x"),
    (dict(model_type="gemma3"), r"model_type='gemma3' \(a multimodal Gemma 3: load its text model"),
    (dict(rope_scaling=dict(rope_type="yarn", factor=4.0)), r"rope scaling 'yarn' is not supported"),
    (dict(rope_parameters=dict(rope_type="longrope", rope_theta=1e4)), r"rope scaling 'longrope' is not supported"),
    (dict(rope_scaling=dict(rope_type="llama3", factor=8.0)), r"'llama3' needs low_freq_factor"),
    (dict(mlp_bias=True), r"mlp_bias=True"),
    (dict(partial_rotary_factor=0.5), r"partial_rotary_factor=0.5"),
    (dict(hidden_act="relu"), r"hidden_act='relu'"),
])
def test_configs_we_cannot_run_are_refused_by_name(tmp_path, change, words):
    folder = write_tiny_model(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text()) | change
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=words):
        load_model(folder)
    with pytest.raises(ConfigError, match=words):
        ModelConfig.from_dict(config)


def test_fused_kernels_run_the_native_block_loop(tmp_path):
    cfg = tiny_config("llama")
    folder = write_tiny_model(tmp_path / "m", cfg)
    check_logits(folder, cfg, fused=True)
    assert load_model(folder).config.native_blocks
