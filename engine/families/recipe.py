"""What a model family is: the few ways it differs from the llama block, its tensors' names, and how a GGUF
file of it reads back into its config.json.

A recipe is data (engine/families/<name>.py): the model (engine/model.py) reads the flags through ModelConfig,
the loader (engine/checkpoint/) reads the tensor table and the GGUF hooks. Adding a family is its recipe and
its test. Nothing here imports the rest of the engine: config.py reads the recipes, not the other way round.

Shape symbols in the tensor table: C hidden, I intermediate, V vocab, D head_dim, q = H*D, kv = Hkv*D.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# One HF tensor of a module: (HF module name, llama.cpp's name, its shape in symbols); several are concatenated
# (dim 0) into one of our modules (q, k, v -> attn.wqkv).
Part = tuple[str, str, tuple[str, ...]]

LLAMA_LAYER: dict[str, list[Part]] = {
    "attn_norm": [("input_layernorm", "attn_norm", ("C",))],
    "mlp_norm": [("post_attention_layernorm", "ffn_norm", ("C",))],
    "attn.wqkv": [("self_attn.q_proj", "attn_q", ("q", "C")), ("self_attn.k_proj", "attn_k", ("kv", "C")),
                  ("self_attn.v_proj", "attn_v", ("kv", "C"))],
    "attn.wo": [("self_attn.o_proj", "attn_output", ("C", "q"))],
    "mlp.w_gate_up": [("mlp.gate_proj", "ffn_gate", ("I", "C")), ("mlp.up_proj", "ffn_up", ("I", "C"))],
    "mlp.w_down": [("mlp.down_proj", "ffn_down", ("C", "I"))],
}
QK_NORMS: dict[str, list[Part]] = {
    "attn.q_norm": [("self_attn.q_norm", "attn_q_norm", ("D",))],
    "attn.k_norm": [("self_attn.k_norm", "attn_k_norm", ("D",))],
}
TOP: dict[str, list[Part]] = {
    "embed": [("model.embed_tokens", "token_embd", ("V", "C"))],
    "norm": [("model.norm", "output_norm", ("C",))],
    "lm_head": [("lm_head", "output", ("V", "C"))],
}


def full_unless_window(d: dict, n_layers: int) -> list[str]:
    """Every layer sliding when the config sets a window (Mistral, Phi-3), else every layer full."""
    return ["sliding_attention" if d.get("sliding_window") else "full_attention"] * n_layers


def qwen_window_layers(d: dict, n_layers: int) -> list[str]:
    """Qwen2/3: with use_sliding_window, layers from max_window_layers on slide (transformers' rule)."""
    slide = d.get("use_sliding_window") and d.get("sliding_window")
    first = d.get("max_window_layers", n_layers)
    return ["sliding_attention" if slide and i >= first else "full_attention" for i in range(n_layers)]


def every_nth_full(n: int, key: str = "sliding_window_pattern") -> Callable[[dict, int], list[str]]:
    """Sliding layers with every n-th one full (Gemma 3: 5 local, then 1 global; Gemma 2: alternating)."""

    def layer_types(d: dict, n_layers: int) -> list[str]:
        every = d.get(key) or d.get(f"_{key}") or n
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n_layers)]

    return layer_types


def no_gguf_extras(meta, config: dict) -> dict:
    return {}


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type
    architecture: str  # config.json's architectures[0], written into folders we make
    covers: str  # the checkpoints it runs, for messages
    layer: dict[str, list[Part]]  # our per-layer module -> the HF tensors concatenated into it
    top: dict[str, list[Part]] = field(default_factory=lambda: dict(TOP))
    # config.json values transformers assumes when a key is missing (HF's config class defaults)
    defaults: dict = field(default_factory=dict)
    # layer_types when config.json lists none: (config dict, n_layers) -> "full_attention" | "sliding_attention"
    layer_types: Callable[[dict, int], list[str]] = full_unless_window
    # the differences from the llama block (engine/model.py), each off by default
    qk_norm: bool = False  # RMSNorm over each head of q and k before rope (Qwen3, Gemma 3)
    norm_offset: float = 0.0  # the checkpoint's norms hold w - 1: the model runs (1 + w) (Gemma)
    sandwich_norms: bool = False  # a norm on the attention and MLP outputs before each residual add (Gemma 2/3)
    embed_scale: bool = False  # embeddings times sqrt(hidden) (Gemma)
    query_pre_attn_scalar: bool = False  # attention scale from query_pre_attn_scalar, not head_dim (Gemma)
    act_key: str = "hidden_act"  # the config key naming the MLP's gate activation
    qkv_bias: bool | None = None  # q/k/v biases: None reads config.json's attention_bias; else fixed by the code
    # False: the CPU kernels' native block loop cannot run this family's blocks (a step runs Block.forward)
    native_blocks: bool = True
    # GGUF: llama.cpp's general.architecture, whether its converter permuted q/k rows (llama-arch rope), and
    # the family's metadata beyond the common keys: (reader's metadata getter, config so far) -> more keys
    gguf_arch: str | None = None
    gguf_permute_qk: bool = False
    gguf_extras: Callable = no_gguf_extras
    tiny: dict = field(default_factory=dict)  # config.json overrides for a small random test model
