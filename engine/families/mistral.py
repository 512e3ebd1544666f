"""Mistral: the llama block with a sliding window on every layer (v0.1's 4096; later versions set none).
llama.cpp writes Mistral as 'llama', so a GGUF file of it reads through llama.py."""
from engine.families.recipe import LLAMA_LAYER, Family

FAMILY = Family(
    model_type="mistral", architecture="MistralForCausalLM", covers="Mistral 7B v0.1-v0.3", layer=LLAMA_LAYER,
    # MistralConfig's own defaults: a config.json without the key slides at 4096, as transformers does
    defaults={"sliding_window": 4096, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072},
    qkv_bias=False,
    tiny={"sliding_window": 8},
)
