"""q2_k, q3_k, q4_k, q5_k, q6_k: GGUF's K-quant blocks, the formats most GGUF files ship (Q4_K_M mixes Q4_K and
Q6_K, Q3_K_M mostly Q3_K with Q4_K, Q5_K and Q6_K, Q2_K mostly Q2_K with Q3_K, Q4_K and Q6_K).

A super-block covers 256 inputs with one fp16 scale d, split into sub-blocks with small integer scales of their
own, so a weight costs 2.625 / 3.4375 / 4.5 / 5.5 / 6.5625 bits:
    q2_k        16 sub-blocks of 16: 4-bit sc and mn, fp16 d and dmin; w = d*sc * q - dmin*mn, q in 0..3
    q3_k        16 sub-blocks of 16: 6-bit sc stored + 32; w = d*sc * q, sc in -32..31, q in -4..3
    q4_k, q5_k  8 sub-blocks of 32: 6-bit sc and mn, fp16 d and dmin (Blocks.m); w = d*sc * q - dmin*mn,
                q in 0..15 (0..31)
    q6_k        16 sub-blocks of 16: int8 sc; w = d*sc * q, q in -32..31
The dequantize twins follow ggml's order of operations (d*sc first: exact in fp32), so they give gguf's own
dequantization bit for bit. The quantizers make valid blocks for weights="q4_k" and the like, not llama.cpp's
exact choices: Q4_K, Q5_K and Q6_K on plain min/max grids, Q2_K and Q3_K with a least-squares search per sub-block
as llama.cpp's (measured against the plain grids on the default model, and against llama-quantize's blocks on the
same weights by bench/quantizer_error.py).

Layouts: the torch twins read canonical Blocks. The CPU kernels (csrc/cpu/kquants.h) read the file's own bytes, 16
rows interleaved field by field (panels.interleave): a block's 4-byte groups of quants for 16 outputs make one
64-byte VNNI operand, its scales for 16 outputs one vector, so packing a file's tensor is a reorder of its bytes
(pack_gguf) and the panels stream exactly the file's bits per weight (the byte codecs: k_bytes.py). Their
activations are llama.cpp's Q8_K: int8 per super-block of 256 with one scale and the sums of every 16 (the mins and
Q3_K's and Q6_K's offsets of 4 and 32 fold in through those sums). Q3_K's and Q6_K's panels have their quant bits
placed for the kernel (k_placed.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.weights import panels
from engine.weights.format import Blocks, Layout, Packed, WeightFormat
from engine.weights.k_bytes import (QK, decoder_qk, encoder_qk, q2_k_from_gguf, q2_k_to_gguf, q3_k_from_gguf,
                                    q3_k_to_gguf, q6_k_from_gguf, q6_k_to_gguf)
from engine.weights.k_placed import BITS, NATIVE_ROWS


def _pad(w: torch.Tensor, sub: int) -> torch.Tensor:
    """[out, in] -> fp32 [out, n_super, subs per super-block, sub], zero-padded to whole super-blocks."""
    x = F.pad(w.float(), (0, -w.shape[1] % QK))
    return x.view(w.shape[0], -1, QK // sub, sub)


def _ratio(x: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """x / unit, 0 where unit is 0."""
    return torch.where(unit == 0, 0.0, x / torch.where(unit == 0, 1.0, unit))


def fit_grid(x: torch.Tensor, top: int, search: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sub-block (x [..., sub]) a step and an offset <= 0 for the levels 0..top: the range min(x, 0)..max(x) on
    top steps, or with a search (llama.cpp's make_qkx2_quants, its errors unweighted) the best of that and of the
    grids of top + c steps over the same range (c in `search`), each refitted by least squares for the step and the
    offset (an offset above 0 cannot be stored: then the step alone). Returns (step, offset), each [...]."""
    lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True)
    span = hi - lo
    best_step, best_off = span / top, lo
    if search is None:
        return best_step[..., 0], best_off[..., 0]
    best_err = ((torch.round(_ratio(x - lo, best_step)).clamp(0, top) * best_step + lo - x) ** 2).sum(-1, keepdim=True)
    n, sx = x.shape[-1], x.sum(-1, keepdim=True)
    for c in search.tolist():
        q = torch.round(_ratio(x - lo, span) * (top + c)).clamp_(0, top)
        sq, sqq, sqx = q.sum(-1, keepdim=True), (q * q).sum(-1, keepdim=True), (q * x).sum(-1, keepdim=True)
        det = n * sqq - sq * sq  # least squares of x ~ step q + off
        step, off = _ratio(n * sqx - sq * sx, det), _ratio(sqq * sx - sq * sqx, det)
        above = off > 0
        step, off = torch.where(above, _ratio(sqx, sqq), step), torch.where(above, 0.0, off)
        err = ((step * q + off - x) ** 2).sum(-1, keepdim=True)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_step, best_off = torch.where(better, step, best_step), torch.where(better, off, best_off)
    return best_step[..., 0].clamp(min=0), best_off[..., 0]


def quantizer_min(fmt: str, sub: int, top: int, scale_bits: int, search: torch.Tensor | None):
    """The K-quants with mins (Q2_K, Q4_K, Q5_K): per sub-block of `sub` inputs the levels 0..top (fit_grid), the
    sub-blocks' steps and mins as scale_bits-bit multiples of the super-block's d and dmin, and the quants rounded
    on the grid as stored."""
    most = (1 << scale_bits) - 1

    def quantize(w: torch.Tensor) -> Blocks:
        x = _pad(w, sub)  # [out, ns, 256 / sub, sub]
        step, off = fit_grid(x, top, search)
        mins = -off
        d, dmin = (step.amax(-1) / most).half(), (mins.amax(-1) / most).half()
        sc = torch.round(_ratio(step, d.float()[..., None])).clamp(0, most)
        mn = torch.round(_ratio(mins, dmin.float()[..., None])).clamp(0, most)
        scale, offset = d.float()[..., None] * sc, dmin.float()[..., None] * mn
        q = torch.round(_ratio(x + offset[..., None], scale[..., None])).clamp(0, top)
        out = w.shape[0]
        return Blocks(fmt, out, w.shape[1], q.to(torch.uint8).view(out, -1), d, dmin,
                      sc.to(torch.uint8).view(out, -1), mn.to(torch.uint8).view(out, -1))
    return quantize


SEARCH = torch.linspace(-0.6, 0.6, 13)  # q3_k: the steps tried per sub-block, amax / (4 + c)


def quantize_q3_k(w: torch.Tensor) -> Blocks:
    """Q3_K after llama.cpp's quantize_row_q3_K_ref, vectorized: per sub-block of 16 the step whose levels -4..3
    fit the values best (each of the steps that put the largest magnitude at -(4 + c), c in SEARCH, refitted by
    least squares, the least squared error kept), then the steps as 6-bit multiples of d with the largest on -32,
    and the quants rounded on the steps as stored. On the default model (bench/quality.py) this gave perplexity
    24.9 where the min/max grid q6_k uses gave 44.9 and ggml's own weighting of each error by x^2 (make_q3_quants)
    29.3; 25 steps within c = +-1.2 gave 24.0 at 1.8x the time (fp32: 13.7)."""
    x = _pad(w, 16)  # [out, ns, 16, 16]
    far = x.gather(-1, x.abs().argmax(-1, keepdim=True))  # [out, ns, 16, 1]
    inv = _ratio(torch.ones_like(far), far)
    # least squares on levels q: step = sum(x q) / sum(q^2), and the squared error sum(x^2) - sum(x q)^2 / sum(q^2)
    # is least where sum(x q)^2 / sum(q^2) is most
    best_fit, best_step = torch.full_like(far, -1.0), torch.zeros_like(far)
    for c in SEARCH.tolist():
        q = torch.round(x * (inv * -(4 + c))).clamp_(-4, 3)
        xq, qq = (x * q).sum(-1, keepdim=True), (q * q).sum(-1, keepdim=True)
        fit = _ratio(xq * xq, qq)
        better = fit > best_fit
        best_fit, best_step = torch.where(better, fit, best_fit), torch.where(better, _ratio(xq, qq), best_step)
    step = best_step[..., 0]  # [out, ns, 16]
    top = step.gather(-1, step.abs().argmax(-1, keepdim=True))[..., 0]  # the signed step of largest magnitude
    d = (top / -32).half()
    sc = torch.round(_ratio(step, d.float()[..., None])).clamp(-32, 31)
    q = torch.round(_ratio(x, (d.float()[..., None] * sc)[..., None])).clamp(-4, 3)
    out = w.shape[0]
    return Blocks("q3_k", out, w.shape[1], q.to(torch.int8).view(out, -1), d, None, sc.to(torch.int8).view(out, -1))


# Q2_K after llama.cpp's quantize_row_q2_K_ref: per sub-block of 16 the grids of (max - min) / (3 + c), c in
# Q2_SEARCH; 4-bit scales and mins. Q4_K and Q5_K keep the plain min/max grid (quantizer_min(..., None)): with
# llama.cpp's search (c in -1..1, 21 grids) a Q4_K tensor of Gaussian weights erred 0.999x llama-quantize's where the
# plain grid erred 1.10x (bench.quantizer_error), but the default model in q4_k moved further from fp32 (KL
# divergence 0.080 / 0.120 on prose / docs and code against the plain grid's 0.073 / 0.102; the search with
# llama.cpp's rms(x) + |x| weights 0.083 / 0.106): the refitted grids clip the largest weights. On Q2_K the search
# did better than the plain grid there too (KL 6.8 / 6.9 against 8.9 / 7.7; weighted 7.4 / 7.9).
Q2_SEARCH = torch.linspace(-0.5, 1.0, 16)
quantize_q2_k = quantizer_min("q2_k", 16, 3, 4, Q2_SEARCH)


def quantize_q6_k(w: torch.Tensor) -> Blocks:
    """Q6_K: per sub-block of 16, a signed step with the largest magnitude on -32; the steps as int8 multiples of
    the super-block's d."""
    x = _pad(w, 16)  # [out, ns, 16, 16]
    far = x.gather(-1, x.abs().argmax(-1, keepdim=True))[..., 0]
    step = far / -32
    d = (step.abs().amax(-1) / 127).half()
    sc = torch.round(_ratio(step, d.float()[..., None])).clamp(-127, 127)
    scale = d.float()[..., None] * sc
    q = torch.round(_ratio(x, scale[..., None])).clamp(-32, 31)
    out = w.shape[0]
    return Blocks("q6_k", out, w.shape[1], q.to(torch.int8).view(out, -1), d, None, sc.to(torch.int8).view(out, -1))


def dequantize(b: Blocks) -> torch.Tensor:
    out = b.out_features
    sub = b.q.shape[1] // b.sc.shape[1]
    q = b.q.float().view(out, b.d.shape[1], -1, sub)  # [out, ns, n_sub, sub]
    scale = b.d.float()[..., None] * b.sc.float().view(out, b.d.shape[1], -1)  # d*sc: exact in fp32, as ggml's
    w = scale[..., None] * q
    if b.m is not None:
        w = w - (b.m.float()[..., None] * b.mn.float().view(out, b.d.shape[1], -1))[..., None]
    return w.reshape(out, -1)[:, : b.in_features]


# ---- the torch twins' layout: canonical Blocks ------------------------------------------------------------


def canonical(b: Blocks) -> tuple[torch.Tensor, ...]:
    return b.tensors


def from_canonical(fmt: str, out: int, n_in: int, tensors) -> Blocks:
    if fmt in ("q3_k", "q6_k"):
        q, d, sc = tensors
        return Blocks(fmt, out, n_in, q, d, None, sc)
    return Blocks(fmt, out, n_in, *tensors)


def canonical_rows(p: Packed, ids: torch.Tensor) -> torch.Tensor:
    return dequantize(from_canonical(p.fmt, len(ids), p.in_features, tuple(t[ids] for t in p.tensors)))


ROWS = Layout(canonical, from_canonical, canonical_rows)
# each block's fields as (bytes, unit) in ggml-common.h's order (panels.interleave)
FIELDS = {
    "q2_k": ((16, 1), (64, 4), (2, 2), (2, 2)),  # scales, qs, d, dmin
    "q3_k": ((32, 4), (64, 4), (12, 1), (2, 2)),  # hmask, qs, scales, d
    "q4_k": ((2, 2), (2, 2), (12, 1), (128, 4)),  # d, dmin, scales, qs
    "q5_k": ((2, 2), (2, 2), (12, 1), (32, 4), (128, 4)),  # d, dmin, scales, qh, qs
    "q6_k": ((128, 4), (64, 4), (16, 1), (2, 2)),  # ql, qh, scales, d
}
NOTE = "the CPU kernel reads the file's bytes; activations at 8 bits per 256 (llama.cpp's Q8_K)"


def record(name: str, bits: float, quantize, from_gguf, to_gguf, head: str | None = None) -> WeightFormat:
    cpu = panels.gguf_layout(QK, FIELDS[name], from_gguf, to_gguf, dequantize, BITS.get(name), NATIVE_ROWS.get(name))
    in_head = f" (a model in it keeps its LM head in {head}, as llama.cpp's {name.upper()} mixes do)" if head else ""
    return WeightFormat(name=name, bits=bits, block=QK, quantize=quantize, dequantize=dequantize,
                        layouts={"torch": ROWS, "cpu": cpu}, cpu_activations="q8_k", gguf=name.upper(),
                        from_gguf=from_gguf, to_gguf=to_gguf, head=head,
                        notes=f"GGUF {name.upper()} super-blocks; {NOTE}{in_head}")


FORMATS = (
    record("q2_k", 2.625, quantize_q2_k, q2_k_from_gguf, q2_k_to_gguf, head="q6_k"),
    record("q3_k", 3.4375, quantize_q3_k, q3_k_from_gguf, q3_k_to_gguf, head="q6_k"),
    record("q4_k", 4.5, quantizer_min("q4_k", 32, 15, 6, None), decoder_qk("q4_k", 4), encoder_qk(4)),
    record("q5_k", 5.5, quantizer_min("q5_k", 32, 31, 6, None), decoder_qk("q5_k", 5), encoder_qk(5)),
    record("q6_k", 6.5625, quantize_q6_k, q6_k_from_gguf, q6_k_to_gguf),
)
