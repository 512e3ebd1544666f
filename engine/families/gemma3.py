"""Gemma 3 (text: 270M, 1B, and the text tower's checkpoints as Gemma3ForCausalLM): embeddings scaled by
sqrt(hidden), (1 + w) RMSNorms, a norm before and after both attention and MLP, GeGLU with tanh-approximated
gelu, per-head q/k norms, and local (sliding, their own rope theta) and global layers, 5 to 1."""
from engine.families.recipe import LLAMA_LAYER, QK_NORMS, Family, every_nth_full

GEMMA_LAYER = LLAMA_LAYER | QK_NORMS | {
    "post_attn_norm": [("post_attention_layernorm", "post_attention_norm", ("C",))],
    "mlp_norm": [("pre_feedforward_layernorm", "ffn_norm", ("C",))],
    "post_mlp_norm": [("post_feedforward_layernorm", "post_ffw_norm", ("C",))],
}


def gguf_extras(meta, config: dict) -> dict:
    """What llama.cpp's Gemma 3 graph fixes instead of storing: the local layers' rope theta (10000), one global
    layer in 6, and the attention scale 1/sqrt(head_dim) (27B, 62 layers: 1/sqrt(hidden / heads))."""
    big = config["num_hidden_layers"] == 62
    scalar = config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"]
    return {"rope_local_base_freq": 10000.0, "sliding_window_pattern": 6, "query_pre_attn_scalar": scalar,
            "hidden_activation": "gelu_pytorch_tanh"}


FAMILY = Family(
    model_type="gemma3_text", architecture="Gemma3ForCausalLM",
    covers="Gemma 3 text models (270M, 1B)", layer=GEMMA_LAYER,
    # Gemma3TextConfig's defaults
    defaults={"rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
              "tie_word_embeddings": True, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
              "attention_bias": False, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
    layer_types=every_nth_full(6), qk_norm=True, norm_offset=1.0, sandwich_norms=True, embed_scale=True,
    query_pre_attn_scalar=True, act_key="hidden_activation",
    gguf_arch="gemma3", gguf_extras=gguf_extras,
    # 7 layers: two local-global cycles' worth (layer 5 global); windows far below the test prompts' length
    tiny={"num_hidden_layers": 7, "head_dim": 32, "query_pre_attn_scalar": 24, "sliding_window": 8,
          "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
)
