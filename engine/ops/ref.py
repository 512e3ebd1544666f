"""The twins: plain torch functions with the fused kernels' signatures, the test oracle and the path that runs
where a kernel does not.

Each twin has the signature of its kernel wrapper (cpu.py, cuda.py) and the same recipe: upcast to fp32, the
formula, cast back. Shapes: N tokens (B*T flattened), H query heads, Hkv kv heads, D head_dim,
S the cache's max length, I the MLP's intermediate size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.ops.ref_sampling import (  # noqa: F401  the sampling twins, re-exported: callers use ref.<name>
    exp_noise, greedy, logsumexp, mask_logits, nucleus_drop, race, softmax)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    # x: [N, hidden], weight: [hidden]; F.rms_norm is x * rsqrt(mean(x^2) + eps) * weight in one call
    y = F.rms_norm(x.float(), x.shape[-1:], weight.float(), eps).to(x.dtype)
    if out is None:
        return y
    return out.copy_(y)


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """residual += x (in place), then returns rmsnorm(residual) written into x.

    The sum is rounded to the residual's dtype before the norm, as an unfused add then norm would."""
    residual.add_(x)
    return rmsnorm(residual, weight, eps, out=x)


def rope_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> None:
    """Rotary embedding in place, HF llama's half-rotation layout.

    q: [N, H, D], k: [N, Hkv, D], cos/sin: [max_pos, D/2] fp32, positions: [N] int (device memory)."""
    c = cos[positions].unsqueeze(1)  # [N, 1, D/2]
    s = sin[positions].unsqueeze(1)
    for x in (q, k):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        x.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1))


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up]: [N, 2I] -> [N, I]."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    y = (F.silu(gate) * up).to(gate_up.dtype)
    if out is None:
        return y
    return out.copy_(y)


def gelu_tanh_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gelu_tanh(gate) * up for gate_up = [gate | up]: [N, 2I] -> [N, I] (Gemma's GeGLU; the tanh form of gelu,
    which is gate * sigmoid(2u), u = sqrt(2/pi) (gate + 0.044715 gate^3): the kernel computes it that way)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    y = (F.gelu(gate, approximate="tanh") * up).to(gate_up.dtype)
    if out is None:
        return y
    return out.copy_(y)


def rmsnorm_heads_(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """RMSNorm over each head in place (Qwen3's and Gemma 3's q/k norms): x [N, H, D] with dense heads and a
    free token stride (a view into the qkv output), weight [D]."""
    x.copy_(F.rms_norm(x.float(), x.shape[-1:], weight.float(), eps).to(x.dtype))


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int = 0,
    sinks: int = 0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """T new queries per row against the cache that already holds their keys.

    q: [B, T, H, D], k_cache/v_cache: [B, Hkv, S, D], seq_lens: [B] int32 (live length, the T new tokens
    included) -> [B, T, H, D]. Query t of row b sits at position p = seq_lens[b] - T + t and attends keys
    j <= p; with window > 0 only the first `sinks` keys and the last `window` up to p (j < sinks or
    j > p - window), the StreamingLLM pattern. GQA by a view: no copies of the cache."""
    return capped_attention(q, k_cache, v_cache, seq_lens, scale, window, sinks, 0.0, out)


def capped_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, window: int = 0, sinks: int = 0, softcap: float = 0.0,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """attention() with the scores soft-capped, cap * tanh(scores / cap), before the mask (Gemma 2); softcap 0
    is attention() itself. No kernel runs it: it is the path of every model that caps."""
    B, T, H, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    qg = q.float().view(B, T, Hkv, H // Hkv, D).permute(0, 2, 3, 1, 4)  # [B, Hkv, n_rep, T, D]
    scores = torch.matmul(qg, k_cache.float().transpose(-1, -2).unsqueeze(2)) * scale  # [B, Hkv, n_rep, T, S]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    pos = (seq_lens.long().view(B, 1) - T + torch.arange(T, device=q.device)).unsqueeze(-1)  # [B, T, 1]
    keys = torch.arange(S, device=q.device)
    live = keys <= pos  # [B, T, S]
    if window > 0:
        live &= (keys < sinks) | (keys > pos - window)
    scores = scores.masked_fill(~live[:, None, None], float("-inf"))
    y = torch.matmul(scores.softmax(-1), v_cache.float().unsqueeze(2))  # [B, Hkv, n_rep, T, D]
    y = y.permute(0, 3, 1, 2, 4).reshape(B, T, H, D).to(q.dtype)
    if out is None:
        return y
    return out.copy_(y)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor,
                     scale: float, window: int = 0, sinks: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
    """attention() for one query per row, at position seq_lens[b] - 1: q [B, H, D] -> [B, H, D]; keys
    j >= seq_lens[b] are masked (and, with a window, the keys between the sinks and the window)."""
    y = attention(q.unsqueeze(1), k_cache, v_cache, seq_lens, scale, window, sinks)[:, 0]
    if out is None:
        return y
    return out.copy_(y)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, in] @ weight [out, in]^T (+ bias) with fp32 accumulation, cast back to x's dtype: the twin of
    every weight-only format (fp32, fp16, bf16, and int8 / q4 once dequantized)."""
    y = x.float() @ weight.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


# ---- the twins' matmuls: (x, a Packed weight in engine/weights.py's "torch" layout) -------------


def matmul_t(x: torch.Tensor, w) -> torch.Tensor:
    """Dense formats: x [N, in] @ the weight stored transposed, [in, out]; a weight stored narrower than x
    (fp16 on a CPU) is upcast, the product accumulated in fp32."""
    w_t = w.tensors[0]
    return x @ w_t if w_t.dtype == x.dtype else (x.float() @ w_t.float()).to(x.dtype)


def matmul_dequantized(x: torch.Tensor, w) -> torch.Tensor:
    """int8 and q4: the blocks dequantized (engine/weights.py's twin of every kernel's weight read), then
    linear(); activations stay as they are."""
    from engine.weights import dequantize, unpack

    return linear(x, dequantize(unpack(w)))


def matmul_int8_a8(x: torch.Tensor, w) -> torch.Tensor:
    """int8, q4_0, q5_0, q4_a8 and q5_1 on a CPU: the blocks against int8 activations, the SIMD kernels' recipe
    (linear_a8)."""
    return linear_a8(x, *w.tensors).to(x.dtype)


def matmul_q8_k(x: torch.Tensor, w) -> torch.Tensor:
    """q4_k, q5_k and q6_k on a CPU: canonical K-quant blocks against Q8_K activations (linear_q8_k)."""
    q, d, *rest = w.tensors
    m, sc, mn = rest if len(rest) == 3 else (None, rest[0], None)
    return linear_q8_k(x, q, d, sc, m, mn).to(x.dtype)


def matmul_int16_a16(x: torch.Tensor, w) -> torch.Tensor:
    """q4 and q8 on a CPU: the blocks against 16-bit activations, the SIMD kernels' recipe (linear_a16)."""
    return linear_a16(x, *w.tensors).to(x.dtype)


FLT_MAX = torch.finfo(torch.float32).max


def quantize_blocks(x: torch.Tensor, in_pad: int, qmax: int, block: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU kernels' activation recipe (csrc/cpu/q16.h block_scales): x [N, in] fp32, zero-padded to in_pad,
    per block of 32 (256 for the K-quants' Q8_K): amax = max|x|, inv = qmax / amax, q = round_half_even(x * inv)
    in [-qmax, qmax], dx = amax / qmax, all in fp32. Defined for every input, as the kernels on every ISA: a
    block holding inf or NaN gives q = 0 and dx = NaN (its row's outputs are NaN, where a float matmul's would be
    inf or NaN); a block whose qmax / amax overflows (zeros, denormals, amax below qmax / FLT_MAX) gives q = 0
    and dx = 0.
    Returns q as float [N, nb, block] (exact integers) and dx [N, nb] fp32."""
    xb = F.pad(x.float(), (0, in_pad - x.shape[-1])).view(x.shape[0], -1, block)
    finite = torch.isfinite(xb).all(-1)
    xb = torch.where(finite[..., None], xb, 0.0)
    amax = xb.abs().amax(-1)
    inv = torch.full_like(amax, qmax) / amax  # inf where amax is 0; `qmax / amax` would multiply by 1 / amax
    tiny = ~(inv <= FLT_MAX)
    inv = torch.where(tiny, 0.0, inv)
    dx = torch.where(finite, torch.where(tiny, 0.0, amax / qmax), float("nan"))
    return torch.round(xb * inv[..., None]), dx


def quantize_activations(x: torch.Tensor, in_pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 kernel's activations: quantize_blocks to [-127, 127]."""
    return quantize_blocks(x, in_pad, 127)


def linear_a8(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """Block weights times int8 activations (the CPU int8 kernel, W8A8 as llama.cpp's Q8_0 path; with m, Q4_1
    blocks against Q8_1's recipe, the q4_a8 kernel, and Q5_1's): x [N, in] fp32, q [out, in_pad] (int8, or uint8
    0..15 / 0..31), d (and m) fp16 [out, nb] ->
        y[n, o] = sum_b (d[o, b] * dx[n, b]) * S[n, o, b]  +  m[o, b] * xs[n, b],   S = sum_i q[o, b, i] * qx[n, b, i]
    with xs = fl(dx * sum_i qx_i), the quantized block sum (csrc/cpu/q16.h says why). The integer sums are exact
    in fp32 (|S| <= 32 * 127 * 127 < 2^24)."""
    qx, dx = quantize_activations(x, q.shape[1])
    sums = torch.einsum("nbi,obi->nob", qx, q.float().view(q.shape[0], -1, 32))  # [N, out, nb]
    if m is None:
        return ((d.float()[None] * dx[:, None]) * sums).sum(-1)
    xs = dx * qx.sum(-1)  # |sum| <= 32 * 127: exact before the product
    y = ((d.float()[None] * dx[:, None]).double() * sums).sum(-1)
    return (y + (m.float()[None].double() * xs[:, None].double()).sum(-1)).float()


def linear_a16(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """q4 (q uint8 0..15, d and m fp16 [out, nb]) or q8 (q int8, d) weights [out, in_pad] against 16-bit
    activations, the CPU kernels' recipe (csrc/cpu/q16.h): x16, dx = quantize_blocks(x, 32767) per row and
    block, the exact integer sums S = sum_i q_i x16_i, and
        y[n, o] = sum_b fl(d[o, b] * dx[n, b]) * S[n, o, b] + m[o, b] * xs[n, b],   xs = fl(dx * sum_i x16_i).
    S is summed as the kernels do, over the halves x16 = 256 hi + lo (each half's sum is exact in fp32, below
    2^24). The kernels fold the blocks in fp32 FMAs in order; here the sum over blocks runs in float64 and is
    rounded once, so the two differ by the kernels' fp32 rounding alone."""
    x16, dx = quantize_blocks(x, q.shape[1], 32767)
    hi = torch.floor(x16 / 256)
    w = q.float().view(q.shape[0], -1, 32)
    sums = 256 * torch.einsum("nbi,obi->nob", hi, w).double() + torch.einsum("nbi,obi->nob", x16 - 256 * hi, w)
    y = ((d.float()[None] * dx[:, None]).double() * sums).sum(-1)  # [N, out]
    if m is not None:
        xs = dx * x16.sum(-1)  # |sum| <= 32 * 32767 < 2^24: exact before the product
        y += (m.float()[None].double() * xs[:, None].double()).sum(-1)
    return y.float()


def linear_q8_k(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, sc: torch.Tensor, m: torch.Tensor | None = None,
                mn: torch.Tensor | None = None) -> torch.Tensor:
    """K-quant weights (engine/weights/k_quants.py: q [out, in_pad], d and m fp16 [out, ns], sc and mn [out, ns *
    n_sub]) against llama.cpp's Q8_K activations, the CPU kernels' recipe (csrc/cpu/kquants.h): qx, dx =
    quantize_blocks(x, 127) per row and super-block of 256, the exact integer sums of each super-block
        isum = sum_s sc_s sum_{i in s} q_i qx_i,     imin = sum_s mn_s sum_{i in s} qx_i
    and one fold per super-block, y += float(isum) fl(d dx) - float(imin) fl(m dx) (float(): one rounding of an
    exact integer, as the kernel's int32 -> fp32). The kernels fold the super-blocks in fp32 FMAs in order; here
    the sum runs in float64 and is rounded once."""
    out, ns = q.shape[0], d.shape[1]
    qx, dx = quantize_blocks(x, q.shape[1], 127, 256)  # [N, ns, 256], [N, ns]
    n_sub = sc.shape[1] // ns
    xs = qx.double().view(x.shape[0], ns, n_sub, -1)
    sums = torch.einsum("nsku,osku->nosk", xs, q.double().view(out, ns, n_sub, -1))  # [N, out, ns, n_sub]
    isum = (sums * sc.double().view(out, ns, n_sub)).sum(-1)
    y = isum.float().double() * (d.float()[None] * dx[:, None]).double()  # [N, out, ns]
    if m is not None:
        imin = (xs.sum(-1)[:, None] * mn.double().view(out, ns, n_sub)).sum(-1)
        y -= imin.float().double() * (m.float()[None] * dx[:, None]).double()
    return y.sum(-1).float()
