"""Gemma 3 against transformers (tests/family_checks.py): embeddings scaled by sqrt(hidden), (1 + w) norms before
and after attention and MLP, GeGLU with tanh gelu, q/k norms, local (sliding, rope theta 10000) and global
layers (theta 1e6, with its own scaling), in both config.json forms."""
from engine import load_model
from engine.config import SLIDING
from engine.tiny import tiny_config
from family_checks import (check_formats_match_their_twins, check_greedy, check_speculative, check_windows_matter,
                           run_all)

NESTED = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
          "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}


def test_gemma3(tmp_path):
    cfg = tiny_config("gemma3_text")
    assert cfg.layer_types[5] == "full_attention" and cfg.layer_types.count(SLIDING) == 6
    assert cfg.local_rope.theta == 10_000.0 and cfg.rope.theta == 1_000_000.0
    folder = run_all(cfg, tmp_path)
    check_windows_matter(folder, cfg, tmp_path)
    model = load_model(folder)
    assert model.config.native_blocks and model.layers[0].post_mlp_norm is not None
    check_formats_match_their_twins(folder, cfg)
    check_greedy(folder, cfg)
    check_speculative(folder, cfg)


def test_gemma3_global_rope_scaling_in_both_forms(tmp_path):
    """The larger Gemma 3s scale the global layers' rope (linear, 8); the local ones keep theta 10000."""
    old = tiny_config("gemma3_text", rope_scaling={"rope_type": "linear", "factor": 4.0})
    new = tiny_config("gemma3_text", rope_parameters=NESTED)
    assert (old.rope, old.local_rope) == (new.rope, new.local_rope) and new.rope.kind == "linear"
    run_all(new, tmp_path)
