"""Gemma 2: Gemma 3's block without the q/k norms, alternating local and global layers on one rope theta, and
tanh soft-capping of the attention scores and of the final logits. The capped attention is its torch twin
(engine/ops/ref.py capped_attention) on every path, so its blocks run in Python."""
from engine.families.gemma3 import GEMMA_LAYER
from engine.families.recipe import QK_NORMS, Family, every_nth_full


def gguf_extras(meta, config: dict) -> dict:
    return {"attn_logit_softcapping": meta("attn_logit_softcapping", 50.0),
            "final_logit_softcapping": meta("final_logit_softcapping", 30.0),
            "query_pre_attn_scalar": config["head_dim"], "hidden_activation": "gelu_pytorch_tanh"}


FAMILY = Family(
    model_type="gemma2", architecture="Gemma2ForCausalLM", covers="Gemma 2 (2B, 9B, 27B)",
    layer={k: v for k, v in GEMMA_LAYER.items() if k not in QK_NORMS},
    defaults={"rms_norm_eps": 1e-6, "max_position_embeddings": 8192, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
              "tie_word_embeddings": True, "rope_theta": 10000.0, "attention_bias": False,
              "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
              "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0},
    layer_types=every_nth_full(2), norm_offset=1.0, sandwich_norms=True, embed_scale=True,
    query_pre_attn_scalar=True, act_key="hidden_activation", native_blocks=False,
    gguf_arch="gemma2", gguf_extras=gguf_extras,
    tiny={"head_dim": 32, "query_pre_attn_scalar": 24, "sliding_window": 8, "attn_logit_softcapping": 2.0,
          "final_logit_softcapping": 5.0},
)
