"""ModelConfig: the one description of a llama-family model, read from an HF config.json."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

# model_type values whose HF implementation is the llama block (Qwen2 adds q/k/v biases).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


class ConfigError(ValueError):
    """A config.json we cannot run; the message says which value and what to do."""


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple = ()  # sorted (key, value) pairs of HF's rope_scaling dict; () for none
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    model_type: str = "llama"
    torch_dtype: str = "float32"
    # derived once in __post_init__
    n_rep: int = field(init=False)
    q_size: int = field(init=False)
    kv_size: int = field(init=False)

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"num_attention_heads={self.n_heads} is not a multiple of num_key_value_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        object.__setattr__(self, "n_rep", self.n_heads // self.n_kv_heads)
        object.__setattr__(self, "q_size", self.n_heads * self.head_dim)
        object.__setattr__(self, "kv_size", self.n_kv_heads * self.head_dim)

    @property
    def rope_scaling_dict(self) -> dict:
        return dict(self.rope_scaling)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"config.json has model_type={model_type!r}; decodescope runs {', '.join(SUPPORTED_MODEL_TYPES)}. "
                "Pick a llama-family model (Llama, TinyLlama, SmolLM2, Mistral, Qwen2)."
            )
        if d.get("sliding_window") and d.get("use_sliding_window", model_type == "mistral"):
            raise ConfigError(f"sliding_window={d['sliding_window']} is not supported; "
                              "pick a model with full attention")
        n_heads = d["num_attention_heads"]
        hidden = d["hidden_size"]
        scaling = d.get("rope_scaling") or {}
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("default", "linear", "llama3"):
                raise ConfigError(f"rope_scaling type {kind!r} is not supported; we run none, 'linear' and 'llama3'")
            scaling = {k: v for k, v in scaling.items() if not isinstance(v, (list, dict))}
            scaling["rope_type"] = kind
        eos = d.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=hidden,
            intermediate_size=d["intermediate_size"],
            n_layers=d["num_hidden_layers"],
            n_heads=n_heads,
            n_kv_heads=d.get("num_key_value_heads") or n_heads,
            head_dim=d.get("head_dim") or hidden // n_heads,
            rms_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=d.get("rope_theta", 10000.0),
            rope_scaling=tuple(sorted(scaling.items())),
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            attention_bias=d.get("attention_bias", model_type == "qwen2"),
            bos_token_id=d.get("bos_token_id"),
            eos_token_ids=eos,
            model_type=model_type,
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except KeyError as e:
            raise ConfigError(f"{path} is missing the key {e.args[0]!r} that a llama-family config has") from None

    def to_hf_dict(self) -> dict:
        """The config.json that HF transformers (and our loader) reads back to this config."""
        arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
        d = dict(
            architectures=[arch[self.model_type]], model_type=self.model_type, vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.n_layers, num_attention_heads=self.n_heads,
            num_key_value_heads=self.n_kv_heads, head_dim=self.head_dim, rms_norm_eps=self.rms_eps,
            rope_theta=self.rope_theta, rope_scaling=self.rope_scaling_dict or None,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings, hidden_act="silu",
            bos_token_id=self.bos_token_id, torch_dtype=self.torch_dtype,
            eos_token_id=list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        )
        if self.model_type == "llama":
            d["attention_bias"] = self.attention_bias
            d["mlp_bias"] = False
        return d


def rope_inv_freq(cfg: ModelConfig):
    """Inverse frequencies [D/2] after HF's rope scaling rules (none, linear, llama3)."""
    import torch

    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = cfg.rope_scaling_dict
    kind = s.get("rope_type", "default")
    if kind == "linear":
        inv = inv / s["factor"]
    elif kind == "llama3":
        factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        lo_wavelen, hi_wavelen = old / lo, old / hi
        scaled = torch.where(wavelen > lo_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        mid = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
        inv = torch.where(mid, smoothed, scaled)
    return inv.float()
