"""Qwen3: Qwen2's block without the biases, with an RMSNorm over each head of q and k before rope."""
from engine.families.recipe import LLAMA_LAYER, QK_NORMS, Family, qwen_window_layers

FAMILY = Family(
    model_type="qwen3", architecture="Qwen3ForCausalLM", covers="Qwen3 (dense)", layer=LLAMA_LAYER | QK_NORMS,
    defaults={"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "head_dim": 128, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28},
    layer_types=qwen_window_layers, qk_norm=True, gguf_arch="qwen3",
    # head_dim above hidden / heads, as Qwen3's own configs have it (128 at hidden 1024 and 16 heads)
    tiny={"head_dim": 32, "tie_word_embeddings": True},
)
