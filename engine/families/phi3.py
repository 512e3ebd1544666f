"""Phi-3 / Phi-3.5 mini: the llama block with q, k, v stored as one qkv_proj and gate, up as one gate_up_proj
(our merged projections take them as they are), and a sliding window on every layer where the config sets one.
The long-context variants' 'longrope' scaling is refused by config.py."""
from engine.families.recipe import LLAMA_LAYER, Family

FAMILY = Family(
    model_type="phi3", architecture="Phi3ForCausalLM", covers="Phi-3 / Phi-3.5 mini (4k context)",
    layer=LLAMA_LAYER | {
        "attn.wqkv": [("self_attn.qkv_proj", "attn_qkv", ("qkv", "C"))],
        "mlp.w_gate_up": [("mlp.gate_up_proj", "ffn_up", ("2I", "C"))],  # llama.cpp keeps it whole as ffn_up
    },
    defaults={"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "sliding_window": None, "bos_token_id": 1,
              "eos_token_id": 32000, "pad_token_id": 32000},
    qkv_bias=False, gguf_arch="phi3",
    tiny={"sliding_window": 12, "pad_token_id": 257},
)
