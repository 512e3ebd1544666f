"""The llama-family transformer: Transformer -> Block -> Attention / MLP, with two attention paths.

Letters used in shape comments:
  B batch rows, T tokens per row in this call, N = B*T, H query heads, Hkv kv heads, D head_dim,
  S the cache's max length, V vocab size, C hidden size, I intermediate size.

Paths (both write their new K/V into the static cache, at positions seq_lens - T + t: the caller has already
advanced the cache's length by T, see Engine._forward):
  prefill  causal attention over the prompt itself (SDPA); the cache held nothing before it.
  cached   T queries per row against the cache: a decode step (T = 1) or a verify pass (T = k + 1),
           ops.attention (the fused kernel where it runs), optionally windowed with attention sinks.
           With the CPU kernels the blocks of this path run in one native call (ops.blocks, whose loop is
           csrc/cpu/ops_blocks.cpp BlockPlan::run): the same kernels in the same order as Block.forward,
           without Python between them, unless `python_blocks` asks for Block.forward itself.
The residual stream goes through add+rmsnorm, so a block is attn -> (add + norm) -> mlp -> (add + norm)
and the norm of the next block (or the final norm) is fused into this block's last add.

A family's differences (engine/families/) arrive as ModelConfig fields and become small optional modules: q/k
norms, norms on the attention and MLP outputs (Gemma), the GeGLU gate, the embedding scale, soft-capping, and
per layer its own sliding window and rope table (Gemma 3's local layers). A layer's own window applies to the
prefill as well; the engine's window (StreamingLLM's) to the cached paths of layers that have none.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from engine import ops as ops_mod
from engine import weights
from engine.ops import ref
from engine.config import ModelConfig, Rope
from engine.kv_cache import KVCache
from engine.layers import ForwardContext, Linear, RMSNorm
from engine.sampling import HeadPicks


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg, self.layer = cfg, layer
        # q, k and v in one matmul: one weight read and one kernel launch instead of three
        self.wqkv = Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias)
        self.wo = Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps) if cfg.qk_norm else None
        self.scale, self.softcap = cfg.attn_scale, cfg.attn_softcap
        self.window = cfg.window(layer)  # this layer's own sliding window, 0 for none
        self.rope = cfg.layer_rope(layer)

    def forward(self, x: torch.Tensor, s: ForwardContext) -> torch.Tensor:
        cfg, B, T, D = self.cfg, s.B, s.T, self.cfg.head_dim
        # views into the one qkv output: the norms, rope and attention take a free token stride, so no copies
        q, k, v = self.wqkv(x).view(B, T, -1).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q, k, v = q.unflatten(-1, (cfg.n_heads, D)), k.unflatten(-1, (cfg.n_kv_heads, D)), v.unflatten(-1, (-1, D))
        if self.q_norm is not None:
            s.ops.rmsnorm_heads_(q.flatten(0, 1), self.q_norm.weight, self.q_norm.eps)
            s.ops.rmsnorm_heads_(k.flatten(0, 1), self.k_norm.weight, self.k_norm.eps)
        cos, sin = s.rope_tables[self.rope]
        s.ops.rope_(q.flatten(0, 1), k.flatten(0, 1), cos, sin, s.flat_positions)  # [N, H|Hkv, D]
        s.cache.write(self.layer, k, v, s.positions, s.start)
        # the prompt attends in full unless the layer slides; the engine's window starts with the cached paths
        window, sinks = (self.window, 0) if self.window or s.mode == "prefill" else (s.window, s.sinks)
        if self.softcap:  # no kernel caps scores: the twin, over the cache, on every path
            n = T if s.mode == "prefill" else s.kv_limit
            kc, vc = s.cache.layer_k[self.layer][:, :, :n], s.cache.layer_v[self.layer][:, :, :n]
            y = ref.capped_attention(q, kc, vc, s.cache.seq_lens, self.scale, window, sinks, self.softcap)
        elif s.mode == "prefill":
            mask = None if not window else causal_window_mask(T, window, x.device)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                               enable_gqa=cfg.n_rep > 1).transpose(1, 2)
        else:
            kc = s.cache.layer_k[self.layer][:, :, : s.kv_limit]  # [B, Hkv, S', D]
            vc = s.cache.layer_v[self.layer][:, :, : s.kv_limit]
            y = s.ops.attention(q, kc, vc, s.cache.seq_lens, self.scale, window, sinks)
        return self.wo(y.reshape(B * T, cfg.q_size))  # y: [B, T, H, D]


def causal_window_mask(T: int, window: int, device) -> torch.Tensor:
    """[T, T] bool, True where query i attends key j: j <= i and j > i - window (a prefill's sliding layer)."""
    i, j = torch.arange(T, device=device)[:, None], torch.arange(T, device=device)[None]
    return (j <= i) & (j > i - window)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w_gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)  # [gate | up]
        self.w_down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.geglu = cfg.activation == "gelu_tanh"  # Gemma's gate; else SwiGLU's silu

    def forward(self, x: torch.Tensor, s: ForwardContext) -> torch.Tensor:
        act = s.ops.gelu_tanh_mul if self.geglu else s.ops.silu_mul
        return self.w_down(act(self.w_gate_up(x)))


@dataclass(frozen=True)
class LayerRecord:
    """One block as a cached forward reads it, each field declared here once. Block.record fills it by name; a
    native block loop takes it by name (engine/ops/cpu.py -> csrc/cpu/ops_blocks.cpp, whose LAYER_FIELDS lists the
    same fields in this order: use_ops checks). None: a part the family lacks. A new block feature is a field
    here, its use in Block.forward, and its line and use in the native loop."""
    qkv: weights.Packed | weights.Stacked  # q, k and v in one matmul (Stacked: in row segments of their formats)
    qkv_bias: torch.Tensor | None  # [Q + 2 KV]
    q_norm: torch.Tensor | None  # [D]: each q head's RMSNorm before rope (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None  # [D]: each k head's, present exactly when q_norm is
    cos: torch.Tensor  # [max_pos, D/2] fp32: this layer's rope table
    sin: torch.Tensor
    k_cache: torch.Tensor  # [B, Hkv, S, D]: this layer's
    v_cache: torch.Tensor
    window: int  # this layer's own sliding window; 0: the run's window and sinks
    n_heads: int
    n_kv_heads: int
    scale: float  # the attention's score scale
    o: weights.Packed | weights.Stacked
    post_attn_norm: torch.Tensor | None  # [C]: on the attention's output before its add (Gemma)
    mlp_norm: torch.Tensor  # [C]
    gate_up: weights.Packed | weights.Stacked  # [gate | up]
    activation: str  # the gate: "silu" | "gelu_tanh"
    intermediate: int
    down: weights.Packed | weights.Stacked
    post_mlp_norm: torch.Tensor | None  # [C]: on the MLP's output before its add (Gemma)
    next_norm: torch.Tensor  # [C]: the next block's attn_norm, the final norm after the last block
    eps: float  # every norm's


LAYER_FIELDS = tuple(f.name for f in fields(LayerRecord))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        C, eps = cfg.hidden_size, cfg.rms_eps
        self.attn_norm = RMSNorm(C, eps)
        self.attn = Attention(cfg, layer)
        self.post_attn_norm = RMSNorm(C, eps) if cfg.sandwich_norms else None  # on the attention's output
        self.mlp_norm = RMSNorm(C, eps)
        self.mlp = MLP(cfg)
        self.post_mlp_norm = RMSNorm(C, eps) if cfg.sandwich_norms else None

    def forward(self, x: torch.Tensor, h: torch.Tensor, next_norm: RMSNorm, s: ForwardContext) -> torch.Tensor:
        """x: this block's attn_norm(h), [N, C]; h: the residual stream. Returns next_norm(h) for the block
        after it; add_rmsnorm adds each branch into h IN PLACE, so h leaves as the new residual stream.
        Its native twin, for the CPU kernels' cached forwards: csrc/cpu/ops_blocks.cpp BlockPlan::run."""
        eps = self.attn_norm.eps
        a = self.attn(x, s)
        if self.post_attn_norm is not None:
            a = s.ops.rmsnorm(a, self.post_attn_norm.weight, eps, out=a)
        x = s.ops.add_rmsnorm(a, h, self.mlp_norm.weight, eps)
        m = self.mlp(x, s)
        if self.post_mlp_norm is not None:
            m = s.ops.rmsnorm(m, self.post_mlp_norm.weight, eps, out=m)
        return s.ops.add_rmsnorm(m, h, next_norm.weight, eps)

    def record(self, next_norm: RMSNorm, cache: KVCache, rope_tables: dict) -> LayerRecord:
        """This block's LayerRecord over `cache`: what Block.forward reads, for a native block loop."""
        a, cfg = self.attn, self.attn.cfg
        cos, sin = rope_tables[a.rope]
        return LayerRecord(
            qkv=a.wqkv.weight, qkv_bias=a.wqkv.bias, q_norm=_weight(a.q_norm), k_norm=_weight(a.k_norm), cos=cos,
            sin=sin, k_cache=cache.layer_k[a.layer], v_cache=cache.layer_v[a.layer], window=a.window,
            n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads, scale=float(a.scale), o=a.wo.weight,
            post_attn_norm=_weight(self.post_attn_norm), mlp_norm=self.mlp_norm.weight,
            gate_up=self.mlp.w_gate_up.weight, activation=cfg.activation, intermediate=cfg.intermediate_size,
            down=self.mlp.w_down.weight, post_mlp_norm=_weight(self.post_mlp_norm), next_norm=next_norm.weight,
            eps=float(self.attn_norm.eps))

    def at_layer(self, j: int) -> Block:
        """This block, its modules shared (no weight copied), writing KV cache layer j (a view's kept layer)."""
        block = copy.copy(self)
        block._modules = dict(self._modules)  # a copy's child table is its own; the children are shared
        block.attn = copy.copy(self.attn)
        block.attn.layer = j
        return block


def _weight(norm: RMSNorm | None) -> torch.Tensor | None:
    return None if norm is None else norm.weight


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        # A tied model's embedding is its head's weight: a lookup dequantizes the rows it needs from it.
        self.embed = None if cfg.tie_word_embeddings else nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.ops = ops_mod.twin_ops("not yet placed on a device")
        self.cos = self.sin = None  # the full layers' rope table; every layer's in rope_tables
        self.position_ids = torch.arange(0)  # 0..n-1 for the rope tables' n positions (ensure_rope)
        self.rope_tables: dict[Rope, tuple[torch.Tensor, torch.Tensor]] = {}
        self.load_notes: list[str] = []  # what the loader did that a user should know (a tensor dequantized)
        self.head_picks: HeadPicks | None = None  # the last head pass's greedy picks, where its ops make them
        self.format: str | None = None  # the format the loader chose (the projections' but those load_notes names)
        self.kv_dtype: torch.dtype | None = None  # the KV cache's, for the engines built on it; None: the activations'
        self.path = None  # the folder it was loaded from
        self.eos_ids: tuple[int, ...] = cfg.eos_token_ids
        self.version = 0  # bumped whenever something a captured graph reads by address is replaced
        # True: cached forwards run Block.forward in Python even where the OpSet has a native block loop; for
        # whoever hooks the blocks (layer-skip calibration), whose hooks the native loop would not call
        self.python_blocks = False

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The activations' dtype (a weight format may store less: engine/weights.py)."""
        return self.norm.weight.dtype

    def linears(self) -> list[Linear]:
        return [m for m in self.modules() if isinstance(m, Linear)]

    @property
    def weight_format(self) -> str:
        """The projections' format (a q4 model keeps its head in int8, see checkpoint.formats.head_format; a GGUF
        model may keep some tensors in another: load_notes says which)."""
        return self.format or self.layers[0].attn.wqkv.weight.fmt

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every projection and norm once, the head included (an
        untied embedding table is not streamed: a step reads one row of it)."""
        norms = sum(p.numel() * p.element_size() for n, p in self.named_parameters() if not n.startswith("embed."))
        return norms + sum(m.weight.nbytes for m in self.linears())

    @property
    def n_params(self) -> int:
        embed = 0 if self.embed is None else self.embed.num_embeddings * self.embed.embedding_dim
        return embed + sum(m.in_features * m.out_features for m in self.linears()) + sum(
            p.numel() for n, p in self.named_parameters() if not n.startswith("embed."))

    def use_ops(self, ops: ops_mod.OpSet) -> None:
        """Fix the kernel-or-twin choice (and the weights' layout with it); a captured CUDA graph notices
        (version) and is captured again."""
        if ops.blocks is not None and ops.block_fields != LAYER_FIELDS:
            raise RuntimeError(f"the native block loop reads the fields {ops.block_fields} but LayerRecord declares "
                               f"{LAYER_FIELDS}: csrc/cpu/ops_blocks.cpp LAYER_FIELDS and engine/model.py LayerRecord "
                               "must list the same fields in the same order")
        for m in self.linears():
            m.place(ops)
        self.ops = ops
        self.version += 1

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] -> [B*T, C] in the activations' dtype (Gemma scales them, by a factor rounded to that
        dtype first, as transformers does)."""
        if self.embed is not None:
            h = self.embed(tokens).reshape(tokens.numel(), -1).to(self.dtype)
        else:
            h = weights.rows(self.lm_head.weight, tokens.reshape(-1)).to(self.dtype)
        scale = self.config.embed_scale
        return h if scale == 1.0 else h.mul_(torch.tensor(scale, dtype=h.dtype).item())

    def ensure_rope(self, n_positions: int) -> None:
        if self.cos is not None and self.cos.shape[0] >= n_positions:
            return
        cfg, tables = self.config, {}
        for rope in {cfg.rope, *(cfg.layer_rope(i) for i in range(cfg.n_layers))}:
            inv = rope.inv_freq(cfg.head_dim, n_positions, cfg.max_position_embeddings).to(self.device)
            angles = torch.outer(torch.arange(n_positions, device=self.device, dtype=torch.float32), inv)
            tables[rope] = (angles.cos(), angles.sin())  # [max_pos, D/2] fp32
        self.rope_tables = tables
        self.cos, self.sin = tables[cfg.rope]
        self.position_ids = torch.arange(n_positions, device=self.device)
        self.version += 1

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] of the final norm's x [N, C]; where the ops can (a CPU kernel), each row's greedy pick is
        made by the head's own pass and kept in head_picks for the engine's pick (sampling.HeadPicks)."""
        cap, w = self.config.final_softcap, self.lm_head.weight
        if self.ops.head_greedy is not None and not cap and isinstance(w, weights.Packed):
            logits, picks = self.ops.head_greedy(x, w)
            self.head_picks = HeadPicks(logits, picks)
            return logits
        logits = self.lm_head(x).float()
        return logits if not cap else torch.tanh(logits / cap).mul_(cap)

    @contextmanager
    def blocks_in_python(self):
        """Run Block.forward for every block while inside (see python_blocks): hooks on the blocks then run."""
        saved, self.python_blocks = self.python_blocks, True
        try:
            yield self
        finally:
            self.python_blocks = saved

    def layer_records(self, cache: KVCache) -> list[LayerRecord]:
        """Every block's record over `cache`, as a native block loop takes them."""
        next_norms = [b.attn_norm for b in self.layers[1:]] + [self.norm]
        return [b.record(n, cache, self.rope_tables) for b, n in zip(self.layers, next_norms, strict=True)]

    def view(self, keep: Sequence[int]) -> Transformer:
        """This model over its layers `keep`, in order, then its final norm and head; every module, table and
        setting shared, no weight copied. Kept layer j writes KV cache layer j, so the view's cache holds
        len(keep) layers (a layer-skip drafter's model)."""
        view = copy.copy(self)  # the settings and tables: ops, rope tables, version, path, eos ids, ...
        nn.Module.__init__(view)  # ... but a child table and hooks of its own (a profiler hooks the target)
        view.training = self.training
        for name, child in self.named_children():
            setattr(view, name, child)
        view.config = self.config.keep_layers(keep)  # each kept layer keeps its own window and rope
        view.layers = nn.ModuleList(self.layers[i].at_layer(j) for j, i in enumerate(keep))
        return view

    def native_blocks(self, s: ForwardContext) -> bool:
        """Whether this forward runs its blocks in one native call (the CPU kernels' ops.blocks): decode
        steps and verify passes whose positions the host knows, unless python_blocks is set or the family's
        blocks are beyond the native loop (ModelConfig.native_blocks)."""
        return (self.ops.blocks is not None and self.config.native_blocks and s.mode == "cached"
                and s.start is not None and not self.python_blocks)

    def forward(self, tokens: torch.Tensor, cache: KVCache, mode: str, kv_limit: int | None = None,
                last_only: bool = False, window: int = 0, sinks: int = 0, start: int | None = None,
                tail: int | None = None) -> torch.Tensor:
        """tokens: [B, T] -> float32 logits [B, T, V] ([B, V] with last_only; [B, tail, V] of the last `tail`
        positions with tail, the head run on those alone). The cache's length already counts these T tokens (the
        caller advanced it), so positions are seq_lens - T + t. start: that first position when the host knows
        it (eager calls: the KV write is then a slice copy, not an index_put)."""
        B, T = tokens.shape
        if start is not None and start + T <= self.position_ids.shape[0]:
            positions = self.position_ids[start:start + T].expand(B, T)  # views; the 4 ops below took ~30 us a CPU step
        else:  # a captured graph's: only the device knows them
            positions = cache.seq_lens.long().unsqueeze(1) - T + torch.arange(T, device=tokens.device)  # [B, T]
        s = ForwardContext(mode, B, T, positions, start, cache, kv_limit or cache.max_seq_len, self.ops,
                           self.rope_tables, window, sinks)
        layers = self.layers
        h = self.embed_tokens(tokens)  # residual stream: [N, C]
        x = self.ops.rmsnorm(h, layers[0].attn_norm.weight, self.config.rms_eps)
        if self.native_blocks(s):
            x = self.ops.blocks(self, x, h, s)  # the loop below, in one native call
        else:
            for i, block in enumerate(layers):
                x = block(x, h, layers[i + 1].attn_norm if i + 1 < len(layers) else self.norm, s)
        x = x.view(B, T, -1)
        if last_only:
            return self.head(x[:, -1]).view(B, -1)
        rows = T if tail is None else min(tail, T)
        return self.head(x[:, T - rows:].reshape(B * rows, -1)).view(B, rows, -1)
