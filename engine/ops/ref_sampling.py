"""The sampling twins (ref.py's, which re-exports them): plain torch functions with the signatures of the CPU
kernels' logsumexp, greedy pick, masked softmax, nucleus, exponential race and sampling noise (cpu.py)."""
from __future__ import annotations

import torch


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
