"""Gemma 2 against transformers (tests/family_checks.py): Gemma 3's block without q/k norms, alternating local and
global layers, and tanh soft-capping of the attention scores and of the final logits. The capped attention is
its twin on every path, so the blocks run in Python even with the CPU kernels."""
import torch

from engine import Engine, load_model
from engine.tiny import tiny_config
from family_checks import check_greedy, check_speculative, check_windows_matter, prompt, ref_logits, reference, run_all


def test_gemma2(tmp_path):
    cfg = tiny_config("gemma2")
    assert cfg.layer_types == ("sliding_attention", "full_attention") * 2
    assert (cfg.attn_softcap, cfg.final_softcap) == (2.0, 5.0) and not cfg.native_blocks
    folder = run_all(cfg, tmp_path)
    check_windows_matter(folder, cfg, tmp_path)
    check_greedy(folder, cfg)
    check_speculative(folder, cfg)


def test_the_caps_matter(tmp_path):
    """Uncapped, the same weights give other logits (so the checks above would catch a missing cap); capped,
    the logits stay within the final cap."""
    cfg = tiny_config("gemma2")
    folder = run_all(cfg, tmp_path)
    ids = prompt(cfg)
    want = ref_logits(reference(folder), ids)
    assert want.abs().max() < cfg.final_softcap
    model = load_model(folder)
    model.layers[0].attn.softcap = 0.0
    assert (Engine(model, 128).logits(ids) - want).abs().max() > 1e-3
    torch.testing.assert_close(Engine(load_model(folder), 128).logits(ids), want, atol=1e-4, rtol=1e-4)
