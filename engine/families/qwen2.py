"""Qwen2 / Qwen2.5: the llama block with q/k/v biases (always: transformers ignores attention_bias here), and
an optional sliding window on the layers from max_window_layers on."""
from engine.families.recipe import LLAMA_LAYER, Family, qwen_window_layers

FAMILY = Family(
    model_type="qwen2", architecture="Qwen2ForCausalLM", covers="Qwen2, Qwen2.5", layer=LLAMA_LAYER,
    defaults={"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "use_sliding_window": False,
              "sliding_window": 4096, "max_window_layers": 28},
    layer_types=qwen_window_layers, qkv_bias=True, gguf_arch="qwen2",
    tiny={"tie_word_embeddings": True},
)
