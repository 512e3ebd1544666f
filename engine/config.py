"""ModelConfig: the one description of a model, read from an HF config.json through its family's recipe.

config.json comes in two forms: transformers 4 keeps `rope_theta` and `rope_scaling` at the top level (Gemma 3
also `rope_local_base_freq`); transformers 5 writes them under `rope_parameters`, either flat or per layer type
({"full_attention": {...}, "sliding_attention": {...}}). Both read the same; a rope kind or a key we cannot
run is refused by name, never dropped.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine import families

FULL, SLIDING = "full_attention", "sliding_attention"
ROPE_KINDS = ("default", "linear", "llama3", "dynamic")
ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


class ConfigError(ValueError):
    """A config.json we cannot run; the message says which value and what to do."""


@dataclass(frozen=True)
class Rope:
    """Rotary frequencies: theta and HF's scaling rule (sorted (key, value) pairs; () for none)."""
    theta: float = 10000.0
    scaling: tuple = ()

    @property
    def kind(self) -> str:
        return dict(self.scaling).get("rope_type", "default")

    def inv_freq(self, head_dim: int, n_positions: int, max_positions: int):
        """Inverse frequencies [D/2] after HF's rules for n_positions positions."""
        import torch

        inv = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        s = dict(self.scaling)
        if self.kind == "linear":
            inv = inv / s["factor"]
        elif self.kind == "dynamic":
            # transformers recomputes theta whenever the sequence outgrows the trained length, so keys cached
            # before and after the switch carry different frequencies; within it, dynamic is the default rope
            trained = s.get("original_max_position_embeddings", max_positions)
            if n_positions > trained:
                raise ConfigError(f"rope_scaling 'dynamic' is exact up to the trained {trained} positions; "
                                  f"a cache of {n_positions} needs more. Use max_seq_len <= {trained}")
        elif self.kind == "llama3":
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
    rope: Rope = Rope()
    local_rope: Rope | None = None  # the sliding layers' own rope (Gemma 3); None: they use `rope`
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    model_type: str = "llama"
    torch_dtype: str = "float32"
    # the family's differences from the llama block (engine/families/recipe.py says what each does)
    layer_types: tuple[str, ...] = ()  # FULL or SLIDING per layer; () is every layer full
    sliding_window: int = 0  # keys a sliding layer attends, its own position included
    qk_norm: bool = False
    norm_offset: float = 0.0
    sandwich_norms: bool = False
    activation: str = "silu"  # "silu" (SwiGLU) | "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0
    attn_scale: float = 0.0  # 0: head_dim ** -0.5
    attn_softcap: float = 0.0  # scores -> cap * tanh(scores / cap); 0: none
    final_softcap: float = 0.0
    native_blocks: bool = True
    # the config.json it was read from (written back by to_hf_dict)
    source: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
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
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * self.n_layers)
        if len(self.layer_types) != self.n_layers or not set(self.layer_types) <= {FULL, SLIDING}:
            raise ConfigError(f"layer_types={list(self.layer_types)} must name {FULL!r} or {SLIDING!r} for each of "
                              f"the {self.n_layers} layers")
        if SLIDING in self.layer_types and self.sliding_window < 1:
            raise ConfigError(f"sliding layers need sliding_window >= 1, got {self.sliding_window}")
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", self.head_dim ** -0.5)
        object.__setattr__(self, "n_rep", self.n_heads // self.n_kv_heads)
        object.__setattr__(self, "q_size", self.n_heads * self.head_dim)
        object.__setattr__(self, "kv_size", self.n_kv_heads * self.head_dim)

    @property
    def family(self) -> families.Family:
        return families.FAMILIES[self.model_type]

    def window(self, layer: int) -> int:
        """Keys layer `layer` attends by its own design: its sliding window, or 0 for all of them."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else 0

    def layer_rope(self, layer: int) -> Rope:
        return self.local_rope if self.local_rope is not None and self.layer_types[layer] == SLIDING else self.rope

    def keep_layers(self, keep) -> ModelConfig:
        """The config of a model made of layers `keep` of this one (a layer-skip view)."""
        return replace(self, n_layers=len(keep), layer_types=tuple(self.layer_types[i] for i in keep))

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        model_type = d.get("model_type")
        family = families.get(model_type)
        if family is None:
            hint = (" (a multimodal Gemma 3: load its text model, model_type 'gemma3_text')"
                    if model_type == "gemma3" else "")
            raise ConfigError(f"config.json has model_type={model_type!r}{hint}; decodescope runs "
                              f"{families.supported()}. Pick a model of one of these families.")
        d = family.defaults | d  # a key config.json leaves out means what transformers' config class assumes
        refuse_unsupported(d)
        n_heads, hidden, n_layers = d["num_attention_heads"], d["hidden_size"], d["num_hidden_layers"]
        head_dim = d.get("head_dim") or hidden // n_heads
        rope, local_rope = read_ropes(d)
        layer_types = tuple(d.get("layer_types") or family.layer_types(d, n_layers))
        act = d.get(family.act_key, "silu")
        if act not in ACTIVATIONS:
            raise ConfigError(f"config.json has {family.act_key}={act!r}; decodescope runs {sorted(ACTIVATIONS)}")
        eos = d.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        bias = family.qkv_bias if family.qkv_bias is not None else bool(d.get("attention_bias", False))
        return cls(
            vocab_size=d["vocab_size"], hidden_size=hidden, intermediate_size=d["intermediate_size"],
            n_layers=n_layers, n_heads=n_heads, n_kv_heads=d.get("num_key_value_heads") or n_heads,
            head_dim=head_dim, rms_eps=d.get("rms_norm_eps", 1e-6), rope=rope, local_rope=local_rope,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            tie_word_embeddings=d.get("tie_word_embeddings", False), attention_bias=bias,
            bos_token_id=d.get("bos_token_id"), eos_token_ids=eos, model_type=model_type,
            torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            layer_types=layer_types, sliding_window=(d.get("sliding_window") or 0) if SLIDING in layer_types else 0,
            qk_norm=family.qk_norm, norm_offset=family.norm_offset, sandwich_norms=family.sandwich_norms,
            activation=ACTIVATIONS[act], embed_scale=hidden ** 0.5 if family.embed_scale else 1.0,
            attn_scale=d["query_pre_attn_scalar"] ** -0.5 if family.query_pre_attn_scalar else 0.0,
            attn_softcap=float(d.get("attn_logit_softcapping") or 0.0),
            final_softcap=float(d.get("final_logit_softcapping") or 0.0),
            native_blocks=family.native_blocks, source=dict(d),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON ({e}); fix it or download the model again") from None
        try:
            return cls.from_dict(d)
        except KeyError as e:
            raise ConfigError(f"{path} is missing the key {e.args[0]!r} that a {d.get('model_type')} config "
                              "has") from None

    def to_hf_dict(self) -> dict:
        """The config.json this config was read from (what HF transformers and our loader read back)."""
        if not self.source:
            raise ConfigError("this config was not read from a config.json; build it with ModelConfig.from_dict")
        if len(self.layer_types) != len(self.source.get("layer_types") or self.layer_types):
            raise ConfigError("this config was cut to fewer layers (keep_layers); it has no config.json")
        return {"architectures": [self.family.architecture], **self.source}


def refuse_unsupported(d: dict) -> None:
    """Settings that change the math in ways the model does not implement fail here, by name."""
    checks = [("mlp_bias", False), ("use_bidirectional_attention", False)]
    for key, fine in checks:
        if d.get(key, fine) not in (fine, None):
            raise ConfigError(f"config.json sets {key}={d[key]!r}, which decodescope does not run")
    factor = (d.get("rope_parameters") or {}).get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if factor not in (1, 1.0, None):
        raise ConfigError(f"config.json sets partial_rotary_factor={factor}; decodescope rotates whole heads only")


def read_ropes(d: dict) -> tuple[Rope, Rope | None]:
    """(the rope of full layers, the sliding layers' own or None) from either config.json form."""
    params = d.get("rope_parameters")
    if params and (FULL in params or SLIDING in params):  # transformers 5, per layer type (Gemma 3)
        full = params.get(FULL) or {}
        local = params.get(SLIDING)
        if local is not None:
            local = {"rope_theta": d.get("rope_local_base_freq", 10000.0)} | local
        full = {"rope_theta": d.get("rope_theta", 10000.0)} | full
    elif params:  # transformers 5, flat
        full, local = {"rope_theta": d.get("rope_theta", 10000.0)} | params, None
    else:  # transformers 4
        full = (d.get("rope_scaling") or {}) | {"rope_theta": d.get("rope_theta", 10000.0)}
        local = {"rope_theta": d["rope_local_base_freq"]} if "rope_local_base_freq" in d else None
    return _rope(full), None if local is None else _rope(local)


def _rope(p: dict) -> Rope:
    kind = p.get("rope_type", p.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise ConfigError(f"rope scaling {kind!r} is not supported; decodescope runs {', '.join(ROPE_KINDS)}")
    if kind == "default":
        return Rope(float(p["rope_theta"]))
    need = {"linear": ("factor",), "dynamic": ("factor",), "llama3": ROPE_KEYS}[kind]
    missing = [k for k in need if k not in p]
    if missing:
        raise ConfigError(f"rope scaling {kind!r} needs {', '.join(missing)} in config.json")
    scaling = {k: p[k] for k in ROPE_KEYS if k in p} | {"rope_type": kind}
    return Rope(float(p["rope_theta"]), tuple(sorted(scaling.items())))

