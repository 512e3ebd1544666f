"""Llama 2 / 3.x (rope scaling llama3, linear, dynamic), TinyLlama, SmolLM2: the block every other recipe
differs from."""
from engine.families.recipe import LLAMA_LAYER, Family

FAMILY = Family(
    model_type="llama", architecture="LlamaForCausalLM",
    covers="Llama 2 / 3.x, TinyLlama, SmolLM2", layer=LLAMA_LAYER,
    defaults={"rms_norm_eps": 1e-6, "max_position_embeddings": 2048},
    gguf_arch="llama", gguf_permute_qk=True,  # llama.cpp's converter interleaves each q/k head's rotary halves
)
