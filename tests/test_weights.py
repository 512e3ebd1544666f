"""engine/weights.py: the canonical blocks and the CPU panel layout packed from them.

The panel packers are pure reshapes, so a round trip must be exact, and the layout is checked element by
element against its definition (the one csrc/cpu/gemm.h reads; q4's in csrc/cpu/kernels.h)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import weights as W
from engine.weights import k_placed, k_quants, panels, q4_0

SHAPES = [(1, 32), (15, 100), (16, 64), (17, 576), (769, 100), (40, 1536)]  # (out, in)


def blocks(fmt: str, out: int, n_in: int, seed: int = 0) -> W.Blocks:
    g = torch.Generator().manual_seed(seed + out * 7 + n_in)
    return W.quantize(torch.randn(out, n_in, generator=g), fmt)


def same_blocks(a: W.Blocks, b: W.Blocks) -> None:
    assert (a.fmt, a.out_features, a.in_features) == (b.fmt, b.out_features, b.in_features)
    for x, y in ((a.q, b.q), (a.d, b.d), (a.m, b.m)):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y)


@pytest.mark.parametrize("fmt", W.PANEL_FORMATS)
@pytest.mark.parametrize("out,n_in", SHAPES)
def test_panels_round_trip(fmt, out, n_in):
    b = blocks(fmt, out, n_in)
    panels = W.to_panels(b)
    assert all(t.is_contiguous() for t in panels)
    same_blocks(W.from_panels(fmt, out, n_in, *panels), b)


@pytest.mark.parametrize("out,n_in", [(17, 100), (33, 64)])
def test_panel_layout_matches_its_definition(out, n_in):
    P, nb = -(-out // 16), -(-n_in // 32)
    dense = blocks("fp32", out, n_in)
    (w,) = W.to_panels(dense)
    assert w.shape == (P, n_in, 16)
    for o, i in [(0, 0), (16, n_in - 1), (out - 1, 3)]:
        assert w[o // 16, i, o % 16] == dense.q[o, i]

    q8 = blocks("int8", out, n_in)
    qs, d = W.to_panels(q8)
    assert qs.shape == (P, nb, 8, 16, 4) and qs.dtype == torch.uint8 and d.shape == (P, nb, 16)
    for o, i in [(0, 0), (16, 37), (out - 1, n_in - 1)]:
        assert int(qs[o // 16, i // 32, i % 32 // 4, o % 16, i % 4]) == int(q8.q[o, i]) + 128
        assert d[o // 16, i // 32, o % 16] == q8.d[o, i // 32]

    q4 = blocks("q4", out, n_in)
    (w4,) = W.to_panels(q4)
    assert w4.shape == (P, nb, 320) and w4.dtype == torch.uint8
    for o, i in [(0, 0), (16, 37), (5, 44), (out - 1, n_in - 1)]:
        block = w4[o // 16, i // 32]  # chunk c = (i % 32) // 8 of [16 outputs][4 bytes]; inputs 4..7 high nibbles
        byte = int(block[(i % 32) // 8 * 64 + (o % 16) * 4 + i % 4])
        assert (byte >> 4 * (i % 8 // 4)) & 0xF == int(q4.q[o, i])
        scales = block[256:].view(torch.float16)  # d[16] then m[16]
        assert scales[o % 16] == q4.d[o, i // 32] and scales[16 + o % 16] == q4.m[o, i // 32]


@pytest.mark.parametrize("out,n_in", [(17, 300), (33, 512)])
def test_k_quant_panels_are_the_files_bytes_interleaved(out, n_in):
    """csrc/cpu/kernels.h's K-quant panels, element by element: in a super-block of a panel, output o's byte k of
    a field sits at the field's start + 16 * (unit * (k // unit)) + unit * (o % 16) + k % unit."""
    fields = {  # (start in the panel, unit, start in the file's block, bytes)
        "q2_k": ((0, 1, 0, 16), (256, 4, 16, 64), (1280, 2, 80, 2), (1312, 2, 82, 2)),  # scales, qs, d, dmin
        "q3_k": ((0, 4, 0, 32), (512, 4, 32, 64), (1536, 1, 96, 12), (1728, 2, 108, 2)),  # hmask, qs, scales, d
        "q4_k": ((0, 2, 0, 2), (32, 2, 2, 2), (64, 1, 4, 12), (256, 4, 16, 128)),  # d, dmin, scales, qs
        "q6_k": ((0, 4, 0, 128), (2048, 4, 128, 64), (3072, 1, 192, 16), (3328, 2, 208, 2)),  # ql, qh, scales, d
    }
    for fmt, spec in fields.items():
        b = blocks(fmt, out, n_in)
        raw = W.get(fmt).to_gguf(b).view(out, -1, {"q2_k": 84, "q3_k": 110, "q4_k": 144, "q6_k": 210}[fmt])
        (w,) = W.to_panels(b)
        if fmt in k_placed.BITS:  # the file's bytes, with their bits placed for the kernel (checked below): put back
            w = k_placed.BITS[fmt][1](w)
        assert w.shape == (-(-out // 16), -(-n_in // 256), 16 * raw.shape[-1]) and w.dtype == torch.uint8
        for at, unit, start, n in spec:
            for o, sb, k in [(0, 0, 0), (16, 0, 3), (out - 1, w.shape[1] - 1, 11), (5, 0, 1), (7, 0, 127)]:
                k %= n
                got = w[o // 16, sb, at + 16 * unit * (k // unit) + unit * (o % 16) + k % unit]
                assert got == raw[o, sb, start + k], (fmt, at, o, sb, k)
    q4k = blocks("q4_k", out, n_in)  # and the quants the kernel reads from a 64-byte group, as its comment says
    (w,) = W.to_panels(q4k)
    for o, i in [(0, 0), (16, 37), (5, 100), (out - 1, 255)]:
        group = (i % 256) // 64 * 8 + (i % 32) // 4
        byte = int(w[o // 16, i // 256, 256 + group * 64 + (o % 16) * 4 + i % 4])
        assert (byte >> 4 * (i % 64 // 32)) & 0xF == int(q4k.q[o, i])
    q6k = blocks("q6_k", out, n_in)  # Q6_K as csrc/cpu/kquants16.h reads the placed super-block
    (w,) = W.to_panels(q6k)
    for o, i in [(0, 0), (16, 37), (5, 100), (3, 161), (out - 1, 255), (out - 1, 230)]:
        h, k, g, j = (i % 256) // 128, (i % 128) // 32, (i % 32) // 4, i % 4
        sb, at = w[o // 16, i // 256], (o % 16) * 4 + j
        # the scales (16 rows a sub-block) and d first, then the quant lines: kernels.h kQ6Scales, kQ6D, kQ6Quants
        assert int(sb[16 * (i % 256 // 16) + o % 16].view(torch.int8)) == int(q6k.sc[o, i // 16]), (o, i)
        assert sb[256 + 2 * (o % 16):258 + 2 * (o % 16)].view(torch.float16) == q6k.d[o, i // 256], (o, i)
        lines = (24 * h + 2 * g, 24 * h + 16 + g, 24 * h + 2 * g + 1)  # X, Y, Z: kernels.h q6k_x_at, ...
        x, y, z = (int(sb[288 + line * 64 + at]) for line in lines)
        q = (x & 63, y & 63, z & 63, (x >> 6) | ((y >> 4) & 12) | ((z >> 2) & 48))[k]
        assert q - 32 == int(q6k.q[o, i]), (o, i)
    q3k = blocks("q3_k", out, n_in)  # Q3_K as csrc/cpu/kquants16.h q3k_operands reads the placed super-block
    (w,) = W.to_panels(q3k)
    for o, i in [(0, 0), (16, 37), (5, 100), (3, 161), (out - 1, 255), (out - 1, 230), (2, 72), (9, 200)]:
        n, j, g, r = (i % 256) // 128, (i % 128) // 32, (i % 32) // 4, i % 4
        sb, at = w[o // 16, i // 256], (o % 16) * 4 + r
        # the scales (16 rows a sub-block, sc + 32 in 6 bits: the file's 12 bytes) and d first, then the lines
        assert sb[192 + 2 * (o % 16):194 + 2 * (o % 16)].view(torch.float16) == q3k.d[o, i // 256], (o, i)
        s = i % 256 // 16  # sub-block s's low 4 bits: byte s % 8's low nibble (s < 8) or high one
        assert (int(sb[16 * (s % 8) + o % 16]) >> 4 * (s // 8)) & 15 == (int(q3k.sc[o, i // 16]) + 32) & 15, (o, i)
        x, z, y = (int(sb[224 + 64 * (8 * k + g) + at]) for k in range(3))  # kernels.h q3k_x_at, q3k_z_at, ...
        v = y if n else x
        q = (v & 7, (v >> 3) & 7, (v >> 6) | ((z >> 6 + n) & 1) << 2, (z >> 3 * n) & 7)[j]
        assert q - 4 == int(q3k.q[o, i]), (o, i)
    q2k = blocks("q2_k", out, n_in)  # Q2_K as csrc/cpu/kquants16.h q2k_operands and scales_q2k read the file's panels
    (w,) = W.to_panels(q2k)
    for o, i in [(0, 0), (16, 37), (5, 100), (3, 161), (out - 1, 255), (out - 1, 230), (2, 72), (9, 200)]:
        n, j, g, r = (i % 256) // 128, (i % 128) // 32, (i % 32) // 4, i % 4
        sb, at = w[o // 16, i // 256], (o % 16) * 4 + r
        s = int(sb[16 * (i % 256 // 16) + o % 16])  # kernels.h kQ2Scales: sub-block s's byte of row o
        assert (s & 15, s >> 4) == (int(q2k.sc[o, i // 16]), int(q2k.mn[o, i // 16])), (o, i)
        assert (int(sb[256 + 64 * (8 * n + g) + at]) >> 2 * j) & 3 == int(q2k.q[o, i]), (o, i)  # q2k_at(n, g)
        assert sb[1280 + 2 * (o % 16):1282 + 2 * (o % 16)].view(torch.float16) == q2k.d[o, i // 256], (o, i)
        assert sb[1312 + 2 * (o % 16):1314 + 2 * (o % 16)].view(torch.float16) == q2k.m[o, i // 256], (o, i)


GGUF_FIELDS = {**k_quants.FIELDS, **q4_0.FIELDS}  # every format whose panels are its file's bytes interleaved


@pytest.mark.parametrize("fmt", [f for f in W.PANEL_FORMATS if W.get(f).layouts["cpu"].pack_gguf])
def test_pack_gguf_is_pack_of_the_files_blocks(fmt):
    """A file's tensor packed straight from its bytes equals its Blocks packed; a wrong row size is refused."""
    b = blocks(fmt, 37, 512)
    raw = W.get(fmt).to_gguf(b)
    pack_gguf = W.get(fmt).layouts["cpu"].pack_gguf
    got = pack_gguf(raw, 37, 512)
    assert all(torch.equal(x, y) for x, y in zip(got, W.to_panels(b), strict=True))
    with pytest.raises(ValueError, match=rf"a \[37, 768\] tensor of .* is 37 rows of {raw.shape[1] * 3 // 2} bytes"):
        pack_gguf(raw, 37, 768)


@pytest.mark.parametrize("fmt", [f for f in W.PANEL_FORMATS if W.get(f).layouts["cpu"].pack_gguf])
def test_pack_gguf_takes_the_rows_in_chunks_of_any_size(fmt):
    """A loader reads a tensor a chunk of rows at a time into one reused buffer: chunks that split panels (5 + 16 +
    11 + 5 rows of 37) pack to the same panels, even when the buffer is overwritten after each; a short tensor is
    refused."""
    raw = W.get(fmt).to_gguf(blocks(fmt, 37, 512))
    pack_gguf = W.get(fmt).layouts["cpu"].pack_gguf
    buf = torch.empty_like(raw)

    def chunks(sizes):
        at = 0
        for n in sizes:
            buf[:n] = raw[at:at + n]
            yield buf[:n]
            buf.fill_(0xFF)  # what the next read would leave there
            at += n

    want = pack_gguf(raw, 37, 512)
    for sizes in ([5, 16, 11, 5], [37], [16, 16, 5], [1] * 37):
        got = pack_gguf(chunks(sizes), 37, 512)
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True)), sizes
    with pytest.raises(ValueError, match=r"is 37 rows, got 32"):
        pack_gguf(chunks([16, 16]), 37, 512)


@pytest.mark.parametrize("fmt", W.PANEL_FORMATS)
def test_padded_outputs_are_zero(fmt):
    panels = W.to_panels(blocks(fmt, 17, 64))
    last = [t[-1] for t in panels]  # the panel holding output 16 and 15 padded ones
    if fmt in ("fp32", "fp16"):
        assert not last[0][:, 1:].any()
    elif fmt == "q4":  # zero scales and mins: whatever the codes, the padded weights are 0
        scales = last[0][:, 256:].view(torch.float16)
        assert not scales[:, 1:16].any() and not scales[:, 17:].any()
    elif fmt in GGUF_FIELDS:  # the file's bytes: padded rows have zero scales, so weigh 0
        assert torch.equal(W.rows(W.Packed(fmt, "cpu", 32, 64, panels), torch.arange(17, 32)), torch.zeros(15, 64))
    else:  # zero scales: whatever the codes, the padded weights are 0
        assert all(not t[:, 1:].any() for t in last[1:])


def test_a_format_without_panels_and_bad_shapes_are_refused(monkeypatch):
    bf16 = W.REGISTRY["bf16"]  # every format has panels today: one whose record has none
    monkeypatch.setitem(W.REGISTRY, "bf16", dataclasses.replace(
        bf16, layouts={k: v for k, v in bf16.layouts.items() if k != "cpu"}))
    with pytest.raises(ValueError, match="the CPU kernels have no layout for 'bf16'"):
        W.to_panels(blocks("bf16", 16, 32))
    qs, d = W.to_panels(blocks("int8", 17, 64))
    bad = r"int8 panels for \[17, 96\] must be \[2, 3, 8, 16, 4\], got \[2, 2, 8, 16, 4\]"
    with pytest.raises(ValueError, match=bad):
        W.from_panels("int8", 17, 96, qs, d)
    with pytest.raises(ValueError, match="int8 panels are 2 tensor"):
        W.from_panels("int8", 17, 64, qs)
    with pytest.raises(ValueError, match=r"scales for \[17, 64\] must be \[2, 2, 16\], got \[2, 16, 2\]"):
        W.from_panels("int8", 17, 64, qs, d.transpose(1, 2))


@pytest.mark.parametrize("fmt", ["int8", "q4"])
def test_quantize_then_dequantize_is_close(fmt):
    w = torch.randn(40, 100, generator=torch.Generator().manual_seed(3))
    b = W.quantize(w, fmt)
    step = (w.abs().max() / 127) if fmt == "int8" else ((w.max() - w.min()) / 15)
    assert (W.dequantize(b) - w).abs().max() <= step  # half a step of rounding plus fp16 scale rounding


@pytest.mark.parametrize("fmt", W.PANEL_FORMATS)
def test_rows_of_every_layout_dequantize_the_blocks(fmt):
    """A tied embedding's lookup (weights.rows): output rows of a packed weight, dequantized without unpacking the
    rest, in every layout the format has: the dequantize twin's rows exactly."""
    b = blocks(fmt, 40, 100)
    ids = torch.tensor([0, 39, 17, 17, 16])
    want = W.dequantize(b)[ids]
    for layout in W.REGISTRY[fmt].layouts:
        got = W.rows(W.pack(b, layout), ids)
        assert torch.equal(got, want), layout
        if layout == "cpu" and fmt in GGUF_FIELDS:  # in 100 is padded to 256 inside
            assert got.is_contiguous()


@pytest.mark.parametrize("fmt", sorted(GGUF_FIELDS))
@pytest.mark.parametrize("out", [1, 16, 37, 100])
def test_native_packing_moves_the_bytes_the_torch_code_moves(fmt, out, monkeypatch):
    """csrc/cpu/ops_pack.cpp against its torch twins (panels.interleave's copies, k_placed.place_q6_k's and
    place_q3_k's words) on random bytes: whole, padded and partial panels, into a slice of a larger tensor as a
    chunked load writes."""
    if panels.native() is None:
        pytest.skip("the CPU kernel library is not loaded here")
    fields = GGUF_FIELDS[fmt]
    size = sum(n for n, _ in fields)
    g = torch.Generator().manual_seed(out)
    raw = torch.randint(0, 256, (out, 3 * size), dtype=torch.uint8, generator=g)
    big = torch.zeros(-(-out // 16) + 2, 3, 16 * size, dtype=torch.uint8)
    native = panels.interleave(raw, out, fields).clone()
    panels.interleave(raw, out, fields, big[1:-1])
    place = k_placed.BITS[fmt][0] if fmt in k_placed.BITS else None
    placed = place(native.clone()) if place else None
    monkeypatch.setattr(panels, "native", lambda: None)
    twin = panels.interleave(raw, out, fields)
    assert torch.equal(native, twin) and torch.equal(big[1:-1], twin)
    assert not big[0].any() and not big[-1].any()  # nothing written outside the slice
    if place:
        assert torch.equal(placed, place(twin.clone()))
        assert not torch.equal(placed, twin)  # the bits did move


@pytest.mark.parametrize("n_in", [256, 100, 1536])
def test_native_q6_k_rows_are_the_torch_lookups(n_in, monkeypatch):
    """A tied Q6_K head's embedding lookup from the kernel library (ops_pack.cpp q6_k_rows) against the torch
    form (unplace, deinterleave, dequantize of the rows' panels), on random bytes (every bit pattern of the
    quants, scales of both signs, any d) and on a quantized weight; padded inputs (100 of 256) cut off."""
    lib = panels.native()
    if lib is None:
        pytest.skip("the CPU kernel library is not loaded here")
    ns, g = -(-n_in // 256), torch.Generator().manual_seed(n_in)
    raw = torch.randint(0, 256, (37, ns * 210), dtype=torch.uint8, generator=g)
    raw.view(37, ns, 210)[..., 208:] = torch.tensor([0x00, 0x3C], dtype=torch.uint8)  # d = 1.0: no inf / NaN
    random = W.Packed("q6_k", "cpu", 37, n_in, W.get("q6_k").layouts["cpu"].pack_gguf(raw, 37, n_in))
    quantized = W.pack(blocks("q6_k", 37, n_in), "cpu")
    ids = torch.tensor([0, 36, 17, 17, 16, 5])
    native = [W.rows(p, ids) for p in (random, quantized)]
    assert k_placed.q6_k_rows(random.tensors[0], ids, n_in) is not None  # the library's path was the one taken
    monkeypatch.setattr(panels, "native", lambda: None)
    for got, p in zip(native, (random, quantized), strict=True):
        want = W.rows(p, ids)
        assert got.shape == (6, n_in) and torch.equal(got, want)
    assert torch.equal(native[1], W.dequantize(blocks("q6_k", 37, n_in))[ids])
    with pytest.raises(RuntimeError, match=r"ids\[1\] = 48 is not a row of 48"):
        lib.q6_k_rows(torch.empty(2, n_in), random.tensors[0], torch.tensor([0, 48]))


@pytest.mark.parametrize("fmt", ["int8", "q8"])
@pytest.mark.parametrize("n_in", [32, 100, 576])
def test_native_q8_rows_are_the_torch_lookups(fmt, n_in, monkeypatch):
    """A tied Q8_0 head's embedding lookup (the default model's, once a step) from the kernel library
    (ops_pack.cpp q8_rows) against the torch form, on every byte value of the quants with scales of both signs,
    rows from different panels and the last padded one; padded inputs (100 of 128) cut off."""
    lib = panels.native()
    if lib is None:
        pytest.skip("the CPU kernel library is not loaded here")
    g = torch.Generator().manual_seed(n_in)
    nb = -(-n_in // 32)
    raw = torch.randint(0, 256, (37, nb, 34), dtype=torch.uint8, generator=g)
    raw[..., :2] = torch.randn(37, nb, generator=g).half()[..., None].view(torch.uint8)  # d of both signs
    random = W.Packed(fmt, "cpu", 37, n_in, W.get(fmt).layouts["cpu"].pack_gguf(raw.view(37, -1), 37, n_in))
    quantized = W.pack(blocks(fmt, 37, n_in), "cpu")
    ids = torch.tensor([0, 36, 17, 17, 16, 5])
    taken = []

    class Spy:  # the library, noting each lookup it made
        def q8_rows(self, *args):
            taken.append(1)
            return lib.q8_rows(*args)

    monkeypatch.setattr(panels, "native", lambda: Spy())
    native = [W.rows(p, ids) for p in (random, quantized)]
    assert len(taken) == 2  # the library's path was the one taken
    monkeypatch.setattr(panels, "native", lambda: None)
    for got, p in zip(native, (random, quantized), strict=True):
        want = W.rows(p, ids)
        assert got.shape == (6, n_in) and torch.equal(got, want)
    assert torch.equal(native[1], W.dequantize(blocks(fmt, 37, n_in))[ids])
    qs, d = random.tensors
    with pytest.raises(RuntimeError, match=r"ids\[1\] = 48 is not a row of 48"):
        lib.q8_rows(torch.empty(2, n_in), qs, d, torch.tensor([0, 48]))
    with pytest.raises(RuntimeError, match="d must be"):
        lib.q8_rows(torch.empty(2, n_in), qs, d[:-1].contiguous(), torch.tensor([0, 1]))


def test_native_packing_refuses_what_it_cannot_move():
    lib = panels.native()
    if lib is None:
        pytest.skip("the CPU kernel library is not loaded here")
    raw = torch.zeros(20, 2 * 144, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match=r"unit 1, 2 or 4 dividing bytes, got \(12, 8\)"):
        lib.interleave_panels(torch.empty(2, 2, 16 * 144, dtype=torch.uint8), raw, [(132, 4), (12, 8)])
    with pytest.raises(RuntimeError, match=r"into must be \[P, nb, 16 \* block bytes\] = \[2, 2, 2304\]"):
        lib.interleave_panels(torch.empty(1, 2, 16 * 144, dtype=torch.uint8), raw, k_quants.FIELDS["q4_k"])
    with pytest.raises(RuntimeError, match=r"w must be Q6_K panels \[\.\.\., nb, 3360\]"):
        lib.place_q6_k(torch.empty(2, 3000, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match=r"w must be Q3_K panels \[\.\.\., nb, 1760\]"):
        lib.place_q3_k(torch.empty(2, 3360, dtype=torch.uint8))
