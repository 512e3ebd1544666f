"""The K-quant panels' bits as their CPU kernels read them (csrc/cpu/kquants16.h): Q6_K's and Q3_K's quant fields
regrouped within the bytes that hold them, and each super-block's scales and d moved to its front, so the kernel
takes a quant with one or two instructions and streams a super-block front to back. Each placement runs natively
where the CPU kernel library is loaded (csrc/cpu/ops_pack.cpp, panels.native); the torch forms here are their twins,
and each has its inverse (the file's bytes again: tests, and a row's lookup for a tied head).
"""
from __future__ import annotations

import math

import torch

from engine.weights import panels


def _bytes4(b: int) -> int:
    """Byte b in each byte of an int32 (as a signed value torch takes)."""
    return int.from_bytes(bytes([b]) * 4, "little", signed=True)


def _q6_k_lines(w: torch.Tensor):
    """Q6_K panels [..., ns, 16 * 210] (contiguous) -> for each 16 panels, views (as int32, 4 bytes of a row each)
    of the lines that hold the quants of a half h and group g (inputs 128h + 32k + 4g + j, k = 0..3, of 16 rows):
    ql's A and B lines (16h + g, 16h + 8 + g) and qh's (32 + 8h + g), each [16, ns, 2, 8, 16]. 16 panels at a time,
    so the temporaries made from them stay small (and in cache)."""
    flat = w.view(math.prod(w.shape[:-2]), *w.shape[-2:])  # (-1 is ambiguous for a tensor of no inputs)
    for i in range(0, flat.shape[0], 16):
        ql = flat[i:i + 16, :, :2048].view(torch.int32).unflatten(-1, (2, 2, 8, 16))
        qh = flat[i:i + 16, :, 2048:3072].view(torch.int32).unflatten(-1, (2, 8, 16))
        yield ql[..., 0, :, :], ql[..., 1, :, :], qh


def _q6_k_order() -> list[int]:
    """Q6_K's 48 quant lines placed in the order the kernel first reads them (csrc/cpu/kernels.h q6k_x_at,
    q6k_y_at, q6k_z_at): for half h, group g's X and Z lines side by side, then the half's 8 Y lines. Returns
    for each placed line the file's line it holds."""
    order = [0] * 48
    for h in range(2):
        for g in range(8):
            order[24 * h + 2 * g] = 16 * h + g  # X, in the file's A line
            order[24 * h + 2 * g + 1] = 32 + 8 * h + g  # Z, in its qh line
            order[24 * h + 16 + g] = 16 * h + 8 + g  # Y, in its B line
    return order


Q6_K_ORDER = _q6_k_order()
Q6_K_HEAD = 16 * (16 + 2)  # a panel super-block's scales and d: the file's last 288 bytes, placed first


def _q6_k_bytes() -> tuple[torch.Tensor, torch.Tensor]:
    """A placed Q6_K panel super-block's 3360 bytes as indices into its file-ordered bytes: the scales and d first,
    then the 48 quant lines in Q6_K_ORDER (csrc/cpu/kernels.h kQ6Scales, kQ6D, kQ6Quants). Returns (for each placed
    byte the file's byte it holds, its inverse)."""
    lines = torch.tensor(Q6_K_ORDER)[:, None] * 64 + torch.arange(64)
    place = torch.cat((torch.arange(3072, 3072 + Q6_K_HEAD), lines.reshape(-1)))
    return place, place.argsort()


Q6_K_PLACE, Q6_K_UNPLACE = _q6_k_bytes()


def _q6_k_reorder(w: torch.Tensor, index: torch.Tensor) -> None:
    """Q6_K panels' super-blocks rearranged, in place: byte n of each <- its byte index[n], 16 panels at a time."""
    flat = w.view(math.prod(w.shape[:-2]), *w.shape[-2:])
    for i in range(0, flat.shape[0], 16):
        sb = flat[i:i + 16]
        sb.copy_(sb[:, :, index])


def place_q6_k(w: torch.Tensor) -> torch.Tensor:
    """Q6_K panels, in place: the same bytes with the bits moved so that the four 6-bit quants q0..q3 a byte
    position holds (inputs 32k apart: the file's A low, B low, A high, B high nibbles and qh's four pairs) read
    as X = q0 | q3[0:2] << 6, Y = q1 | q3[2:4] << 6, Z = q2 | q3[4:6] << 6 in the A, B and qh lines, then each
    super-block put in the order the kernel reads it: the scales and d first, then the lines (Q6_K_ORDER). The
    kernel (csrc/cpu/kquants16.h q6k_group) then takes q0, q1, q2 with one AND each and q3 from the three top pairs,
    11 instructions for the four where the file's nibbles and pairs took 18, and streams each super-block front to
    back (csrc/cpu/kernels.h kQ6Quants says what each order measured). Natively where the CPU kernel library is
    loaded (panels.native), the same moves on each 4-byte word; this torch form is its twin."""
    if (lib := panels.native()) is not None and w.is_contiguous():
        lib.place_q6_k(w)
        return w
    f0, f3, c0, t0 = (_bytes4(v) for v in (0x0F, 0x30, 0xC0, 0xF0))
    for a, b, h in _q6_k_lines(w):
        x = (a & f0) | ((h << 4) & f3) | ((b << 2) & c0)  # q0 (A low, qh 0-1), q3's bits 0-1 (B's bits 4-5)
        y = (b & f0) | ((h << 2) & f3) | (b & c0)  # q1 (B low, qh 2-3), q3's bits 2-3 (B's bits 6-7)
        h.copy_(((a >> 4) & f0) | (h & t0))  # q2 (A high, qh 4-5), q3's bits 4-5 (qh 6-7)
        a.copy_(x), b.copy_(y)
    _q6_k_reorder(w, Q6_K_PLACE)
    return w


def unplace_q6_k(w: torch.Tensor) -> torch.Tensor:
    """The inverse of place_q6_k, into a new tensor: the file's ql and qh bytes again."""
    w = w.clone(memory_format=torch.contiguous_format)  # one copy, contiguous for _q6_k_lines' views
    _q6_k_reorder(w, Q6_K_UNPLACE)
    f0, f3, c0, t0, m3, mc = (_bytes4(v) for v in (0x0F, 0x30, 0xC0, 0xF0, 0x03, 0x0C))
    for x, y, z in _q6_k_lines(w):
        a = (x & f0) | ((z & f0) << 4)  # q0's and q2's low nibbles
        b = (y & f0) | ((x >> 2) & f3) | (y & c0)  # q1's low nibble; q3's from X's and Y's top pairs
        z.copy_(((x >> 4) & m3) | ((y >> 2) & mc) | (z & t0))  # the four high pairs
        x.copy_(a), y.copy_(b)
    return w


Q3_K_HEAD = 16 * (12 + 2)  # a panel super-block's scales and d: the file's last 224 bytes, placed first


def _q3_k_sbs(w: torch.Tensor):
    """Q3_K panels [..., ns, 16 * 110] (contiguous) -> their super-blocks [n, 1760], 4096 at a time (so the
    temporaries made from them stay small)."""
    flat = w.view(-1, 16 * 110)
    for i in range(0, flat.shape[0], 4096):
        yield flat[i:i + 4096]


def place_q3_k(w: torch.Tensor) -> torch.Tensor:
    """Q3_K panels, in place: each super-block's scales and d first, then for each group g of 4 inputs (of 16 rows:
    64-byte lines) its hmask line g and qs lines g and 8 + g, whose bytes hold the 8 quants q(n, j) of inputs
    128n + 32j + 4g + r as 2 low bits and a high one (+ 4: 0..7), rewritten as X = q(0,0) | q(0,1) << 3 | q(0,2)
    low 2 bits << 6, Y = the same of q(1, .), Z = q(0,3) | q(1,3) << 3 | q(0,2)'s high bit << 6 | q(1,2)'s << 7,
    lines X 0-7, Z 0-7, Y 0-7 (csrc/cpu/kernels.h q3k_x_at). The kernel (csrc/cpu/kquants16.h q3k_operands) then
    takes 6 quants with one or two instructions each and 2 with four, where the file's 2-bit and 1-bit fields took
    four or five each. Natively where the CPU kernel library is loaded (panels.native); this torch form is its twin."""
    if (lib := panels.native()) is not None and w.is_contiguous():
        lib.place_q3_k(w)
        return w
    for sb in _q3_k_sbs(w):
        h, a, b = sb[:, :512].view(-1, 8, 64), sb[:, 512:1024].view(-1, 8, 64), sb[:, 1024:1536].view(-1, 8, 64)
        # q(n, j) of each byte, 0..7: bits 2j, 2j + 1 of qs line n (a, b), bit 4n + j of the hmask line as bit 2
        (q00, q01, q02, q03), (q10, q11, q12, q13) = (
            [((qs >> 2 * j) & 3) | (((h >> 4 * n + j) & 1) << 2) for j in range(4)] for n, qs in ((0, a), (1, b)))
        x = q00 | q01 << 3 | (q02 & 3) << 6
        y = q10 | q11 << 3 | (q12 & 3) << 6
        z = q03 | q13 << 3 | (q02 >> 2) << 6 | (q12 >> 2) << 7
        sb.copy_(torch.cat((sb[:, 1536:], x.flatten(1), z.flatten(1), y.flatten(1)), 1))
    return w


def unplace_q3_k(w: torch.Tensor) -> torch.Tensor:
    """The inverse of place_q3_k, into a new tensor: the file's hmask and qs bytes again."""
    w = w.clone(memory_format=torch.contiguous_format)
    for sb in _q3_k_sbs(w):
        x, z, y = (sb[:, Q3_K_HEAD + 512 * k:Q3_K_HEAD + 512 * (k + 1)].view(-1, 8, 64) for k in range(3))
        q = [[x & 7, (x >> 3) & 7, ((x >> 6) & 3) | (((z >> 6) & 1) << 2), z & 7],
             [y & 7, (y >> 3) & 7, ((y >> 6) & 3) | (((z >> 7) & 1) << 2), (z >> 3) & 7]]
        qs = [sum((q[n][j] & 3) << 2 * j for j in range(4)) for n in range(2)]
        h = sum((q[n][j] >> 2) << 4 * n + j for n in range(2) for j in range(4))
        sb.copy_(torch.cat((h.flatten(1), qs[0].flatten(1), qs[1].flatten(1), sb[:, :Q3_K_HEAD]), 1))
    return w


def q6_k_rows(w: torch.Tensor, ids: torch.Tensor, n_in: int) -> torch.Tensor | None:
    """Rows `ids` of placed Q6_K panels as fp32 [len(ids), n_in], natively (a tied head's embedding lookup: the
    torch form, unplace_q6_k, deinterleave and dequantize of the rows' panels, takes ~0.47 ms a token on
    Qwen2.5-1.5B's 1536 inputs, in ~40 small ops); None where the CPU kernel library is not loaded."""
    if (lib := panels.native()) is None or not w.is_contiguous():
        return None
    out = torch.empty(ids.numel(), n_in)
    lib.q6_k_rows(out, w, ids.reshape(-1).contiguous())
    return out


# the panels' bits as the kernel reads them (panels.gguf_layout)
BITS = {"q3_k": (place_q3_k, unplace_q3_k), "q6_k": (place_q6_k, unplace_q6_k)}
NATIVE_ROWS = {"q6_k": q6_k_rows}  # a row's lookup from the kernel library (panels.gguf_layout)
