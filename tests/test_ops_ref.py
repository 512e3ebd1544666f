"""The torch twins (engine/ops/ref.py) against fp64 formulas written out independently.

The references take the twins' inputs, already rounded to the test dtype, as exact fp64 values, so the
only differences are the twin's fp32 arithmetic and its final rounding to the dtype:
  fp32: a few fp32 ulps of accumulated error -> rtol 1e-5 (1e-4 where a long sum feeds an exp);
  bf16 / fp16: at most one ulp of the output dtype, i.e. rtol = finfo(dtype).eps, plus an atol of 1e-5
  for outputs near zero, where the ulp is tiny but the fp32 error of a sum is not.
"""
from __future__ import annotations

import math

import pytest
import torch

from engine.ops import ref

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def tol(dtype: torch.dtype, fp32_rtol: float = 1e-5) -> dict:
    if dtype == torch.float32:
        return dict(rtol=fp32_rtol, atol=fp32_rtol)
    return dict(rtol=torch.finfo(dtype).eps, atol=1e-5)


def close(actual: torch.Tensor, expected64: torch.Tensor, **kw) -> None:
    torch.testing.assert_close(actual.double(), expected64, **kw)


# --- rmsnorm -------------------------------------------------------------------------------------------


def rmsnorm64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.float64)
    for r, row in enumerate(x.double().tolist()):
        inv = 1.0 / math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
        scaled = [v * inv * wj for v, wj in zip(row, w.double().tolist(), strict=True)]
        out[r] = torch.tensor(scaled, dtype=torch.float64)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 111, 769])
def test_rmsnorm(dtype, hidden):
    g = torch.Generator().manual_seed(hidden)
    x = (torch.randn(3, hidden, generator=g) * 3).to(dtype)
    w = (1 + 0.5 * torch.randn(hidden, generator=g)).to(dtype)
    y = ref.rmsnorm(x, w, 1e-5)
    assert y.dtype == dtype and y.shape == x.shape
    close(y, rmsnorm64(x, w, 1e-5), **tol(dtype))
    out = torch.full_like(x, float("nan"))
    assert ref.rmsnorm(x, w, 1e-5, out=out) is out
    torch.testing.assert_close(out, y, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [111, 769])
def test_add_rmsnorm_updates_both_in_place(dtype, hidden):
    g = torch.Generator().manual_seed(hidden + 1)
    x = torch.randn(4, hidden, generator=g).to(dtype)
    residual = (torch.randn(4, hidden, generator=g) * 4).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    x0, r0 = x.clone(), residual.clone()
    y = ref.add_rmsnorm(x, residual, w, 1e-6)
    assert y is x
    # the residual is rounded to the dtype before the norm: one rounding of an exact fp64 sum
    close(residual, (x0.double() + r0.double()).to(dtype).double(), **tol(dtype))
    close(x, rmsnorm64(residual, w, 1e-6), **tol(dtype))


# --- rope ----------------------------------------------------------------------------------------------


def angles64(max_pos: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    inv_freq = [theta ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    return torch.tensor([[p * f for f in inv_freq] for p in range(max_pos)], dtype=torch.float64)


def rope64(x: torch.Tensor, ang: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """HF half rotation as complex multiplication: (x[i] + j x[i + D/2]) * e^(j angle[pos, i])."""
    half = x.shape[-1] // 2
    xd = x.double()
    z = torch.complex(xd[..., :half], xd[..., half:])
    rot = torch.polar(torch.ones_like(ang[positions]), ang[positions]).unsqueeze(1)  # [N, 1, D/2]
    zr = z * rot
    return torch.cat([zr.real, zr.imag], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,n_heads,n_kv_heads", [(64, 9, 3), (128, 8, 8), (16, 4, 1)])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_rope(dtype, head_dim, n_heads, n_kv_heads, pos_dtype):
    g = torch.Generator().manual_seed(head_dim + n_heads)
    max_pos = 4100
    ang = angles64(max_pos, head_dim)
    cos, sin = ang.cos().float(), ang.sin().float()
    positions = torch.tensor([0, 4099, 7, 7, 256, 1], dtype=pos_dtype)  # unsorted, repeated, both ends
    q = torch.randn(6, n_heads, head_dim, generator=g).to(dtype)
    k = torch.randn(6, n_kv_heads, head_dim, generator=g).to(dtype)
    q0, k0 = q.clone(), k.clone()
    assert ref.rope_(q, k, cos, sin, positions) is None
    # fp32 cos/sin tables are rounded (~6e-8 relative) at angles up to ~4100 rad
    close(q, rope64(q0, ang, positions.long()), **tol(dtype))
    close(k, rope64(k0, ang, positions.long()), **tol(dtype))


# --- silu_mul ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [1, 111, 769])
def test_silu_mul(dtype, inter):
    g = torch.Generator().manual_seed(inter)
    gate_up = (torch.randn(5, 2 * inter, generator=g) * 4).to(dtype)
    gate, up = gate_up.double()[:, :inter], gate_up.double()[:, inter:]
    expected = gate / (1 + torch.exp(-gate)) * up
    y = ref.silu_mul(gate_up)
    assert y.shape == (5, inter) and y.dtype == dtype
    close(y, expected, **tol(dtype))
    out = torch.full((5, inter), float("nan"), dtype=dtype)
    assert ref.silu_mul(gate_up, out=out) is out
    torch.testing.assert_close(out, y, rtol=0, atol=0)


# --- decode_attention ----------------------------------------------------------------------------------


def decode_attention64(q, k_cache, v_cache, seq_lens, scale) -> torch.Tensor:
    """Explicit softmax over the live keys of each (row, head); query head h reads kv head h // (H / Hkv)."""
    B, H, D = q.shape
    n_rep = H // k_cache.shape[1]
    out = torch.empty(B, H, D, dtype=torch.float64)
    for b in range(B):
        n = int(seq_lens[b])
        for h in range(H):
            k = k_cache[b, h // n_rep, :n].double()
            v = v_cache[b, h // n_rep, :n].double()
            s = [scale * float(q[b, h].double() @ k[j]) for j in range(n)]
            m = max(s)
            p = torch.tensor([math.exp(x - m) for x in s], dtype=torch.float64)
            out[b, h] = (p / p.sum()) @ v
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, 4), (9, 3), (8, 1)])
@pytest.mark.parametrize("lens", [[1], [255], [256], [257], [257, 1, 130]])
def test_decode_attention(dtype, n_heads, n_kv_heads, lens):
    g = torch.Generator().manual_seed(sum(lens) + n_heads)
    B, S, D = len(lens), 260, 64
    q = torch.randn(B, n_heads, D, generator=g).to(dtype)
    k = torch.randn(B, n_kv_heads, S, D, generator=g).to(dtype)
    v = torch.randn(B, n_kv_heads, S, D, generator=g).to(dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    for b, n in enumerate(lens):  # entries past seq_len must not matter: make them loud
        k[b, :, n:] = 300.0
        v[b, :, n:] = 300.0
    scale = D ** -0.5
    y = ref.decode_attention(q, k, v, seq_lens, scale)
    assert y.shape == q.shape and y.dtype == dtype
    close(y, decode_attention64(q, k, v, seq_lens, scale), **tol(dtype, fp32_rtol=1e-4))
    out = torch.full_like(q, float("nan"))
    assert ref.decode_attention(q, k, v, seq_lens, scale, out=out) is out
    torch.testing.assert_close(out, y, rtol=0, atol=0)


# --- attention over T queries, with a window and sinks ----------------------------------------------------


def attention64(q, k_cache, v_cache, seq_lens, scale, window=0, sinks=0) -> torch.Tensor:
    """Explicit softmax, query by query, over the keys the definition allows: j <= p, and with a window only
    j < sinks or j > p - window, where p = seq_lens[b] - T + t."""
    B, T, H, D = q.shape
    n_rep = H // k_cache.shape[1]
    out = torch.empty(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            p = int(seq_lens[b]) - T + t
            keys = [j for j in range(p + 1) if window == 0 or j < sinks or j > p - window]
            for h in range(H):
                k = k_cache[b, h // n_rep, keys].double()
                s = torch.softmax(scale * (k @ q[b, t, h].double()), 0)
                out[b, t, h] = s @ v_cache[b, h // n_rep, keys].double()
    return out


@pytest.mark.parametrize("T", [1, 3, 6])
@pytest.mark.parametrize("window, sinks", [(0, 0), (4, 0), (4, 4), (16, 2), (1, 1)])
def test_attention_windows_and_sinks(T, window, sinks):
    g = torch.Generator().manual_seed(T * 100 + window + sinks)
    lens, S, D, H, Hkv = [40, 9, 3 + T], 48, 16, 6, 2
    q = torch.randn(len(lens), T, H, D, generator=g)
    k, v = torch.randn(2, len(lens), Hkv, S, D, generator=g)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    for b, n in enumerate(lens):  # entries past seq_len must not matter: make them loud
        k[b, :, n:] = v[b, :, n:] = 300.0
    y = ref.attention(q, k, v, seq_lens, 0.25, window, sinks)
    close(y, attention64(q, k, v, seq_lens, 0.25, window, sinks), rtol=1e-5, atol=1e-6)


def test_a_window_wider_than_the_context_is_full_attention():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 4, 8, generator=g)
    k, v = torch.randn(2, 1, 2, 30, 8, generator=g)
    seq_lens = torch.tensor([20], dtype=torch.int32)
    full = ref.attention(q, k, v, seq_lens, 0.3)
    torch.testing.assert_close(ref.attention(q, k, v, seq_lens, 0.3, window=16, sinks=4), full, rtol=0, atol=0)


# --- the quantized formats' activations and matmuls ---------------------------------------------------------


def test_quantize_blocks_defines_every_input():
    """Per block of 32: q = round_half_even(x * qmax / amax) with dx = amax / qmax (q * dx within dx / 2 of x);
    inf or NaN anywhere in a block gives q = 0 and dx = NaN; a block too small to scale (zeros, denormals, amax
    below qmax / FLT_MAX) gives q = 0 and dx = 0; the padding past `in` counts as zeros."""
    for qmax in (127, 32767):
        x = torch.randn(2, 200, generator=torch.Generator().manual_seed(qmax)) * 3
        x[1, 33] = float("inf")
        x[1, 70] = float("nan")
        x[1, 96:128] = 1e-40
        x[1, 128:160] = 1e-38 if qmax == 127 else 1e-35  # normal, but qmax / amax overflows fp32
        x[1, 160:162] = 1e-41  # denormals beside normal values
        q, dx = ref.quantize_blocks(x, 224, qmax)
        assert q.shape == (2, 7, 32) and dx.shape == (2, 7)
        assert q.abs().max() <= qmax and torch.equal(q, q.round())
        assert dx[1, 1].isnan() and dx[1, 2].isnan() and not q[1, 1:3].any()
        assert dx[1, 3] == 0 and dx[1, 4] == 0 and not q[1, 3:5].any()
        assert q[1, 5, :2].eq(0).all()
        xb = torch.nn.functional.pad(x, (0, 24)).view(2, 7, 32)
        ok = torch.ones(2, 7, dtype=torch.bool)
        ok[1, 1:5] = False
        amax = xb.abs().amax(-1)
        torch.testing.assert_close(dx[ok], (amax / qmax)[ok], rtol=0, atol=0)
        err = (q * dx[..., None] - xb)[ok]
        assert (err.abs() <= (dx[..., None] / 2 * (1 + 1e-6)).expand_as(q)[ok]).all()
        assert not q[:, 6, 8:].any()  # the padding


@pytest.mark.parametrize("fmt", ["q4", "q8"])
def test_linear_a16_is_the_dot_product_with_the_dequantized_activations(fmt):
    """linear_a16 against fp64 written out: y = sum_b d dx S + m xs with S the exact integer sums of q and x16 and
    xs = dx sum x16 (every product and sum in fp64, fp32 only where the recipe rounds: d * dx and xs). The twin
    sums the blocks in fp64 and rounds once: rtol 1e-6."""
    from engine import weights as W

    g = torch.Generator().manual_seed(5)
    b = W.quantize(torch.randn(24, 100, generator=g), fmt)
    x = torch.randn(3, 100, generator=g) * 4
    x16, dx = ref.quantize_blocks(x, 128, 32767)
    q = b.q.double().view(24, 4, 32)
    want = torch.zeros(3, 24, dtype=torch.float64)
    for n in range(3):
        for o in range(24):
            for blk in range(4):
                S = sum(int(q[o, blk, i]) * int(x16[n, blk, i]) for i in range(32))
                want[n, o] += float(b.d[o, blk].float() * dx[n, blk]) * S  # the fp32 product, as the recipe
                if b.m is not None:
                    want[n, o] += float(b.m[o, blk]) * float(dx[n, blk] * x16[n, blk].sum())
    torch.testing.assert_close(ref.linear_a16(x, *b.tensors).double(), want, rtol=1e-6, atol=1e-6)
