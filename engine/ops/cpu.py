"""Thin wrappers over the CPU kernels (csrc/cpu/), with the signatures of the twins in ref.py.

They allocate outputs (or write into `out=`); the module checks shapes, dtypes and strides and says which
value is wrong, splits the work across its threads and records itself for torch.profiler. `ops(module)`
is what engine.ops.select builds the CPU OpSet from.
"""
from __future__ import annotations

import weakref
from types import ModuleType

import torch

from engine.ops.rowwise import RowwiseOps
from engine.weights import Packed


class CpuOps(RowwiseOps):
    """The CPU module's ops, and the block loop's plans: one BlockPlan per (model, KV cache), kept weakly with
    the cache (a plan goes with its cache) until the model changes (its version: use_ops repacks the weights,
    ensure_rope replaces the tables)."""

    def __init__(self, module: ModuleType):
        super().__init__(module)
        # the module's format codes by the names engine/weights' records carry (csrc/cpu/formats.h)
        self.codes = {name: code for code, name in enumerate(module.formats())}
        self.plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache -> (model, version, plan)

    # the families' row-wise ops the CPU module has (the CUDA module runs their twins: engine/ops/__init__.py)
    def gelu_tanh_mul(self, gate_up: torch.Tensor, out: torch.Tensor | None = None):
        return self._gated(self.module.gelu_tanh_mul, gate_up, out)

    def rmsnorm_heads_(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        self.module.rmsnorm_heads(x, weight, float(eps))

    def attention(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                  scale: float, window: int = 0, sinks: int = 0, out: torch.Tensor | None = None):
        # q: [B, T, H, D], k_cache/v_cache: [B, Hkv, S, D], seq_lens: [B] int32
        out = torch.empty(q.shape, dtype=q.dtype) if out is None else out
        self.module.attention(out, q, k_cache, v_cache, seq_lens, float(scale), int(window), int(sinks))
        return out

    def matmul(self, fmt: str):
        """The matmul of one weight format: (x [N, in], a Packed weight in the CPU panel layout) -> [N, out]."""
        linear, code = self.module.linear, self.codes[fmt]

        def matmul(x: torch.Tensor, w: Packed) -> torch.Tensor:
            out = x.new_empty(x.shape[0], w.out_features)
            linear(out, x.contiguous(), code, list(w.tensors))
            return out

        return matmul

    def blocks(self, model, x: torch.Tensor, h: torch.Tensor, s) -> torch.Tensor:
        """Block.forward of every block of `model` in one native call (csrc/cpu/ops_blocks.cpp): the same
        kernels in the same order, so the same numbers. x = attn_norm_0(h) [N, C]; h is updated in place, as
        the blocks do; returns the final norm of h. `s` is the forward's ForwardContext (cached mode, start
        known on the host)."""
        return self.plan(model, s.cache).run(x, h, s.flat_positions, s.cache.seq_lens, s.start, s.kv_limit,
                                             int(s.window), int(s.sinks))

    def plan(self, model, cache):
        """The native BlockPlan of (model, cache): its weights and KV layers gathered once."""
        saved = self.plans.get(cache)
        if saved is not None and saved[0]() is model and saved[1] == model.version:
            return saved[2]
        m, cfg, blocks = self.module, model.config, model.layers

        def projection(linear) -> object:
            return m.Projection(self.codes[linear.weight.fmt], list(linear.weight.tensors))

        def weight(module) -> torch.Tensor:  # a family's optional norm: its weight, or none
            return self.none if module is None else module.weight

        layers = []
        for i, b in enumerate(blocks):
            next_norm = blocks[i + 1].attn_norm if i + 1 < len(blocks) else model.norm
            bias, a = b.attn.wqkv.bias, b.attn
            cos, sin = model.rope_tables[a.rope]
            layers.append(m.BlockWeights(
                mlp_norm=b.mlp_norm.weight, next_norm=next_norm.weight, k_cache=cache.layer_k[a.layer],
                v_cache=cache.layer_v[a.layer], qkv_bias=self.none if bias is None else bias,
                qkv=projection(a.wqkv), o=projection(a.wo), gate_up=projection(b.mlp.w_gate_up),
                down=projection(b.mlp.w_down), q_norm=weight(a.q_norm), k_norm=weight(a.k_norm),
                post_attn_norm=weight(b.post_attn_norm), post_mlp_norm=weight(b.post_mlp_norm), cos=cos, sin=sin,
                window=a.window))
        plan = m.BlockPlan(layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, intermediate=cfg.intermediate_size,
                           eps=float(cfg.rms_eps), scale=float(blocks[0].attn.scale), activation=cfg.activation)
        self.plans[cache] = (weakref.ref(model), model.version, plan)
        return plan

    none = torch.empty(0)


def ops(module: ModuleType) -> dict:
    """The OpSet fields the CPU kernels fill, bound to one CpuOps."""
    c = CpuOps(module)
    return dict(rmsnorm=c.rmsnorm, add_rmsnorm=c.add_rmsnorm, rope_=c.rope_, silu_mul=c.silu_mul,
                gelu_tanh_mul=c.gelu_tanh_mul, rmsnorm_heads_=c.rmsnorm_heads_,
                attention=c.attention, layout="cpu", linear={fmt: c.matmul(fmt) for fmt in c.codes},
                blocks=c.blocks)
