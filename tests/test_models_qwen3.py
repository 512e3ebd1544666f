"""Qwen3 against transformers (tests/family_checks.py): an RMSNorm over each head of q and k before rope, a
head_dim above hidden / heads, no biases."""
from engine import load_model
from engine.tiny import tiny_config
from family_checks import check_formats_match_their_twins, check_greedy, check_speculative, run_all


def test_qwen3(tmp_path):
    cfg = tiny_config("qwen3")
    assert cfg.qk_norm and cfg.head_dim == 32 and cfg.q_size > cfg.hidden_size
    folder = run_all(cfg, tmp_path)
    model = load_model(folder)
    assert model.layers[1].attn.q_norm is not None and model.layers[1].attn.k_norm.weight.shape == (32,)
    check_formats_match_their_twins(folder, cfg)
    check_greedy(folder, cfg)
    check_speculative(folder, cfg)
