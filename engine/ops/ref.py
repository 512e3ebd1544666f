"""The twins: plain torch functions with the fused kernels' signatures, the test oracle and the path that runs
where a kernel does not.

Each twin has the signature of its kernel wrapper (cpu.py, cuda.py) and the same recipe: upcast to fp32, the
formula, cast back. Shapes: N tokens (B*T flattened), H query heads, Hkv kv heads, D head_dim,
S the cache's max length, I the MLP's intermediate size.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


def logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x[r]))) of each row: [R, V] -> [R] float32 (the greedy pick's shown probability,
    engine/sampling.py shown_at)."""
    return torch.logsumexp(x.float(), dim=-1)


def greedy(x: torch.Tensor) -> list[tuple[int, float, float]]:
    """Each row's greedy pick of x [R, V]: (the first index of the maximum, as argmax takes it, a NaN winning; the
    maximum; logsumexp), what a greedy pick and its shown probability exp(max - logsumexp) need, on the host."""
    x = x.float()
    best = x.argmax(-1)
    top = x.gather(-1, best[:, None])[:, 0]
    return list(zip(best.tolist(), top.double().tolist(), torch.logsumexp(x, dim=-1).double().tolist(), strict=True))


def softmax(x: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """softmax(x / temperature) of each row in float32 over the tokens top-k and top-p keep (mask_logits), 0
    elsewhere: [R, V] -> [R, V] (a sampled pick's distribution, engine/sampling.py probs)."""
    y = x.float() / temperature
    if top_k or top_p < 1:
        y = mask_logits(y, top_k, top_p)
    return y.softmax(-1)


NUCLEUS_CANDIDATES = 256  # the most likely tokens a CPU nucleus is first looked for among (x8 until they hold it)


def mask_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [R, V] -> the same with tokens outside top-k / the top-p nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose mass reaches top_p (always >= 1 token): tokens in
    descending order, ties by index (a stable sort), each kept while the mass before it, softmax's probabilities
    summed in that order, is below top_p (nucleus_drop)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1:
        logits = logits.masked_fill(nucleus_drop(logits, top_p), float("-inf"))
    return logits


def nucleus_drop(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """bool [R, V]: the tokens outside each row's top-p nucleus (mask_logits). On a GPU the row is sorted; on the
    CPU, where sorting 49,152 logits took 3.4 ms (most of a default-model step), the nucleus is looked for among the
    top NUCLEUS_CANDIDATES by torch.topk, 8 times as many until the last of them falls outside it: the same values
    in the same order, so the same masses and the same cut."""
    V = logits.shape[-1]
    k, total = min(V, NUCLEUS_CANDIDATES) if logits.device.type == "cpu" else V, None
    while True:
        top = (torch.topk(logits, k, dim=-1).values if k < V
               else logits.sort(dim=-1, descending=True, stable=True).values)
        if total is None:
            # softmax's recipe, exp(x - max) / sum, the sum and the masses in doubles: torch sums a row of a batch
            # in another order than the row alone, and a float32 total moved a cut between a verify pass and a step
            most = top[:, :1]
            total = torch.exp(logits - most).sum(-1, keepdim=True, dtype=torch.float64)
        p = (top - most).exp().double() / total
        kept = p.cumsum(-1) - p < top_p  # the mass before each token is below top_p: a prefix of the order
        if k == V or not kept[:, -1].any():
            break
        k = min(V, 8 * k)
    # the last kept value; a row holding NaN keeps none (its masses are NaN): its first value, so it drops nothing
    t = top.gather(-1, kept.sum(-1, keepdim=True).clamp_min(1) - 1)
    kept_at_t = (kept & (top == t)).sum(-1, keepdim=True)
    # every token at t is a candidate when the last candidate is below t: the ties are counted there, not in the
    # row (each op over a whole row wakes torch's threads, ~60-100 us on 2 cores)
    inside = k == V or bool((top[:, -1:] < t).all())
    at_t = (top == t) if inside else (logits == t)
    if bool((at_t.sum(-1, keepdim=True) == kept_at_t).all()):  # every token at the cut is kept
        return logits < t
    tied = logits == t
    return (logits < t) | (tied & (tied.cumsum(-1) > kept_at_t))  # ties beyond the kept ones: the later indices


def race(weights: torch.Tensor, keys: list[int]) -> torch.Tensor:
    """The exponential race of each row: weights [R, V] >= 0 against the noise of R position keys (exp_noise's
    rows) -> [R] long, argmax(weights[r] / noise row r): the CPU kernel's twin. Where an OpSet has no race kernel,
    engine/sampling.py's Noise races the same way over the rows it keeps (a speculative round draws a position
    twice: the drafter's draw, then the verify pass's)."""
    V = weights.shape[-1]
    noise = torch.stack([exp_noise(torch.empty(V, device=weights.device), key) for key in keys])
    return (weights / noise).argmax(-1)


MASK32 = 0xFFFFFFFF


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finalizer in place over an int64 tensor of 32-bit values (products wrap, then are masked)."""
    h.bitwise_xor_(h >> 16).mul_(0x85EBCA6B).bitwise_and_(MASK32)
    h.bitwise_xor_(h >> 13).mul_(0xC2B2AE35).bitwise_and_(MASK32)
    return h.bitwise_xor_(h >> 16)


def exp_noise(out: torch.Tensor, key: int) -> torch.Tensor:
    """The sampling noise of one output position (engine/sampling.py Noise) into out [V] float32: Exp(1) values
    -log(u_i), u_i = (2k + 1) / 2^24 of 23 hashed bits, k = fmix32(fmix32(i * 0x9E3779B9 ^ key_lo) ^ key_hi) >> 9:
    a function of (key, i) alone, so the CPU kernel (csrc/cpu/noise.h) makes the same u_i; its log agrees with
    torch's to ~1 ulp. u never reaches 0 or 1, so every value is finite and > 0 (at most 16.6)."""
    x = torch.arange(out.shape[0], dtype=torch.int64, device=out.device)
    x.mul_(0x9E3779B9).bitwise_and_(MASK32).bitwise_xor_(key & MASK32)
    x = fmix32(fmix32(x).bitwise_xor_(key >> 32))
    u = x.bitwise_right_shift_(9).mul_(2).add_(1).to(torch.float32).mul_(2.0 ** -24)  # exact: below 2^24
    return out.copy_(u.log_().neg_())


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
