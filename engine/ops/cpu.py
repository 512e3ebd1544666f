"""Thin wrappers over the CPU kernels (csrc/cpu/), with the signatures of the twins in ref.py.

They allocate outputs (or write into `out=`); the module checks shapes, dtypes and strides and says which
value is wrong, splits the work across its threads and records itself for torch.profiler. `ops(module)`
is what engine.ops.select builds the CPU OpSet from.
"""
from __future__ import annotations

import dataclasses
import weakref
from types import ModuleType

import torch

from engine.ops import ref
from engine.ops.rowwise import RowwiseOps
from engine.weights import Packed, Stacked


class CpuOps(RowwiseOps):
    """The CPU module's ops, and the block loop's plans: one BlockPlan per (model, KV cache), kept weakly with
    the cache (a plan goes with its cache) until the model changes (its version: use_ops repacks the weights,
    ensure_rope replaces the tables)."""

    def __init__(self, module: ModuleType):
        super().__init__(module)
        # the module's format codes by the names engine/weights' records carry (csrc/format_list.h)
        self.codes = {name: code for code, name in enumerate(module.formats())}
        self.plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cache -> (model, version, plan)

    # the families' row-wise ops the CPU module has (the CUDA module runs their twins: engine/ops/__init__.py)
    def gelu_tanh_mul(self, gate_up: torch.Tensor, out: torch.Tensor | None = None):
        return self._gated(self.module.gelu_tanh_mul, gate_up, out)

    def rmsnorm_heads_(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        self.module.rmsnorm_heads(x, weight, float(eps))

    def logsumexp(self, x: torch.Tensor) -> torch.Tensor:
        """ref.logsumexp through the module for float32 rows on the CPU (a 49,152-token row in ~34 us where
        torch's softmax took ~120 on 2 AVX2 cores), anything else through the twin."""
        if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
            return ref.logsumexp(x)
        out = torch.empty(x.shape[0])
        self.module.logsumexp(out, x.contiguous())
        return out

    def greedy(self, x: torch.Tensor) -> list[tuple[int, float, float]]:
        """ref.greedy through the module for float32 rows on the CPU (one pass split across the threads, the
        argmax looked for in the one stretch of 1,024 values that holds the maximum), anything else through
        the twin."""
        if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
            return ref.greedy(x)
        return self.module.greedy(x.contiguous())

    def head_greedy(self, x: torch.Tensor, w: Packed) -> tuple[torch.Tensor, list[tuple[int, float, float]]]:
        """A head's matmul with greedy's picks of its rows: each 1,024 logits reduced as soon as the kernel
        wrote them (csrc/cpu/greedy.h; the same numbers as greedy over the finished rows)."""
        out = x.new_empty(x.shape[0], w.out_features)
        return out, self.module.linear_greedy(out, x.contiguous(), self.codes[w.fmt], list(w.tensors))

    def softmax(self, x: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
        """ref.softmax through the module for float32 rows on the CPU, anything else through the twin. Without
        top-k / top-p: the temperature, the row's max and its exps in one pass, split across the threads, then one
        scaling pass. With them: the twin's mask without sorting the row (csrc/cpu/nucleus.h), a row alone split
        across the threads, a verify pass's rows one a thread; a row holding inf or NaN goes to the twin."""
        if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
            return ref.softmax(x, temperature, top_k, top_p)
        out, x = torch.empty(x.shape), x.contiguous()
        if not (0 < top_k < x.shape[-1] or top_p < 1):
            self.module.softmax(out, x, float(temperature))
        elif not self.module.nucleus(out, x, float(temperature), int(top_k), float(top_p)):
            return ref.softmax(x, temperature, top_k, top_p)
        return out

    def race(self, weights: torch.Tensor, keys: list[int]) -> torch.Tensor:
        """ref.race through the module for float32 rows on the CPU: the noise made on the fly (its log only where
        a token could still win, csrc/cpu/noise.h race_keyed_span), no row or quotients written, the row split
        across the threads; anything else through the twin."""
        if weights.dim() != 2 or weights.dtype != torch.float32 or weights.device.type != "cpu":
            return ref.race(weights, keys)
        out = torch.empty(weights.shape[0], dtype=torch.long)
        self.module.race(out, weights.contiguous(), list(keys))
        return out

    def exp_noise(self, out: torch.Tensor, key: int) -> torch.Tensor:
        """ref.exp_noise through the module: the same uniforms, a 49,152-token row in ~86 us where the twin's
        torch integer ops take ~760 (and torch.rand's generator, the noise before, ~350; 2 AVX2 cores)."""
        if out.device.type != "cpu" or out.dtype != torch.float32 or not out.is_contiguous():
            return ref.exp_noise(out, key)
        self.module.exp_noise(out, key)
        return out

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
        """The native BlockPlan of (model, cache): every block's LayerRecord, passed by field name, read once."""
        saved = self.plans.get(cache)
        if saved is not None and saved[0]() is model and saved[1] == model.version:
            return saved[2]
        plan = self.module.BlockPlan([{f.name: self.native(getattr(r, f.name)) for f in dataclasses.fields(r)}
                                      for r in model.layer_records(cache)])
        self.plans[cache] = (weakref.ref(model), model.version, plan)
        return plan

    def native(self, value):
        """A record's field as the module takes it: a weight as its segments (one Projection each: format code,
        packed tensors, output rows), an absent part as an empty tensor."""
        if isinstance(value, (Packed, Stacked)):
            return [self.module.Projection(self.codes[s.fmt], list(s.tensors), s.out_features)
                    for s in value.segments]
        return self.none if value is None else value

    none = torch.empty(0)


def ops(module: ModuleType) -> dict:
    """The OpSet fields the CPU kernels fill, bound to one CpuOps."""
    c = CpuOps(module)
    return dict(rmsnorm=c.rmsnorm, add_rmsnorm=c.add_rmsnorm, rope_=c.rope_, silu_mul=c.silu_mul,
                gelu_tanh_mul=c.gelu_tanh_mul, rmsnorm_heads_=c.rmsnorm_heads_, logsumexp=c.logsumexp,
                greedy=c.greedy, head_greedy=c.head_greedy,
                softmax=c.softmax, race=c.race, exp_noise=c.exp_noise,
                attention=c.attention, layout="cpu", linear={fmt: c.matmul(fmt) for fmt in c.codes},
                blocks=c.blocks, block_fields=tuple(module.block_fields()))
