// The contract between the per-ISA kernels (kernels_avx2.cpp, kernels_avx512.cpp: torch-free, each compiled
// for its instruction set) and the torch-facing host code (ops_*.cpp). Plain C++ only. The host code picks
// one KernelTable at load (isa.cpp) and calls through it; it also owns threading, so every kernel takes the
// range of work items it should do and is safe to run on disjoint ranges at once.
//
// Letters: T rows of activations (tokens), P panels of 16 outputs, nb blocks of 32 inputs (nb = ceil(in/32)).
#pragma once

#include <array>
#include <cstdint>

#include "../format_list.h"

namespace decodescope::cpu {

constexpr int kPanel = 16;  // outputs per panel: one 512-bit register of fp32
constexpr int kBlock = 32;  // inputs per quantization block (GGUF Q8_0 / Q4_1)

// The weight formats the CPU kernels run, the rows of ../format_list.h whose cpu column says yes: the index of
// KernelTable::linear and of formats.h's records (engine/ops/cpu.py maps the records' names to these codes at load).
#define DECODESCOPE_CPU_CODE(name_, bits_, block_, cpu_, code_, ...) DECODESCOPE_CPU_##cpu_(code_, )
enum Format : int { DECODESCOPE_FORMATS(DECODESCOPE_CPU_CODE) kNumFormats };
#undef DECODESCOPE_CPU_CODE

// 16-bit activations, what the q4 and q8 kernels read instead of x (q16.h): per row and block of 32,
// x16 = round_half_even(x * (32767 / amax)) in [-32767, 32767], dx = amax / 32767, split into int8 halves
// x16 = 256 * hi + lo (hi = x16 >> 8 signed, lo = x16 & 255 unsigned: exact for every x16, no clamp). Each ISA's
// prep writes the planes its kernels read: hi and lo (every path), xp (AVX2's q8); rows past T may be read by an
// AMX tile (never stored), so the host allocates kAct16PadRows more. Per [T, nb]: dx; xs = dx * sum(x16),
// the quantized block sum q4's min term multiplies; sum16 = sum(x16) and shi = sum(hi), exact.
constexpr int kAct16PadRows = 15;
struct Act16 {
  int64_t ld;      // elements per row of a plane: nb * 32
  int8_t* hi;      // [T + pad, ld]
  uint8_t* lo;     // [T + pad, ld]
  int16_t* xp;     // [T, ld]: x16 with each group of 4 in kPairOrder (AVX2's int16 pairs)
  float* dx;       // [T, nb]
  float* xs;       // [T, nb]
  int32_t* sum16;  // [T, nb]
  int32_t* shi;    // [T, nb]
};
// The inputs of a group of 4 in the order AVX2's q8 kernel reads them: its weight pairs (0, 2) and (1, 3).
constexpr int kPairOrder[4] = {0, 2, 1, 3};

// q4 panels: one stream [P, nb, kQ4BlockBytes], each block of 16 outputs x 32 inputs as 4 chunks c of
// [16 outputs j][4 bytes r], byte = q[j, 8c+r] | q[j, 8c+4+r] << 4, then d[16] and m[16] fp16 (gemm.h q4_tile).
constexpr int kQ4Chunk = 64;
constexpr int kQ4Nibbles = 4 * kQ4Chunk;
constexpr int kQ4BlockBytes = kQ4Nibbles + 2 * 2 * kPanel;  // 320: 5 bits a weight, as GGUF's Q4_1

// K-quant panels (kquants.h): one stream [P, ns, bytes] (ns = ceil(in / 256) super-blocks), each super-block the
// file's block of 16 rows interleaved field by field (engine/weights/panels.py interleave), fields in the file's
// order: q4_k d[16], dmin[16] fp16, 12 scale bytes x 16, 32 groups of [16 rows][4 quant bytes]; q5_k the same
// with 8 groups of [16][4] high-bit bytes before the quants. q6_k's file order (32 groups of ql, 16 of qh, 16 int8
// scales x 16, d[16]) is placed (engine/weights/k_placed.py place_q6_k) as its scales x 16 and d[16] first, then
// its 48 quant lines with their bits regrouped and the lines reordered. q3_k's file order (8 groups of [16 rows]
// [4 hmask bytes], 16 of [16][4 qs bytes], 12 scale bytes x 16, d[16]) is placed (k_placed.py place_q3_k) as its
// scales x 16 and d[16] first, then 24 quant lines, X, Z and Y of each group of 4 inputs: the 8 quants q(n, j)
// (input 128n + 32j + 4g + r, stored + 4: 0..7) a byte position holds as X = q(0,0) | q(0,1) << 3 | q(0,2)[0:2] << 6,
// Y = q(1,0) | q(1,1) << 3 | q(1,2)[0:2] << 6, Z = q(0,3) | q(1,3) << 3 | q(0,2)[2] << 6 | q(1,2)[2] << 7.
// q2_k's panels keep the file's order: 16 scale bytes x 16 (sub-block s's scale in byte s's low nibble, its min in
// the high one), 16 groups of [16 rows][4 qs bytes], d[16], dmin[16]. Each the file's own bits per weight.
constexpr int kSuper = 256;
constexpr int kQ2KBytes = 16 * 84, kQ3KBytes = 16 * 110, kQ4KBytes = 16 * 144, kQ5KBytes = 16 * 176;
constexpr int kQ6KBytes = 16 * 210;
constexpr int kQ2Scales = 0, kQ2Quants = 256, kQ2D = 1280, kQ2DMin = 1312;
// Where the qs line of half n, group g is: its bytes 4g.. of 16 rows, inputs 128n + 32j + 4g.. (j = 0..3).
constexpr int q2k_at(int n, int g) { return kQ2Quants + 64 * (8 * n + g); }
constexpr int kQ3Scales = 0, kQ3D = 192, kQ3Quants = 224;
// Where the X, Z and Y lines of group g are: in the order the kernel's quarters first read them.
constexpr int q3k_x_at(int g) { return kQ3Quants + 64 * g; }
constexpr int q3k_z_at(int g) { return kQ3Quants + 64 * (8 + g); }
constexpr int q3k_y_at(int g) { return kQ3Quants + 64 * (16 + g); }
// A placed Q6_K super-block: its 16 int8 scales x 16 rows, d[16], then 48 quant lines (64 bytes: 4 bytes of 16
// rows), all in the order the kernel first reads them, so a super-block streams front to back.
// Measured on an AVX2 EPYC (Q6_K matrices of Qwen2.5-1.5B's MLP shapes streamed from memory, against Q4_K's GB/s
// in the same process; the two compute at the same GB/s from L2): the file's A, B and qh lines in three places,
// 0.6-0.7 of Q4_K; the lines in reading order with the scales still last (read first, 3 KB ahead of the quants, at
// each super-block's start), 0.73-0.87 on one thread and 0.78-0.93 on two; the scales first as well, 0.92-0.99
// and 0.90-1.01.
constexpr int kQ6Scales = 0, kQ6D = 256, kQ6Quants = 288;
// Where q6k_group finds the X, Y and Z lines of half h, group g: X and Z side by side, then the half's 8 Y lines.
constexpr int q6k_x_at(int h, int g) { return kQ6Quants + 64 * (24 * h + 2 * g); }
constexpr int q6k_z_at(int h, int g) { return kQ6Quants + 64 * (24 * h + 2 * g + 1); }
constexpr int q6k_y_at(int h, int g) { return kQ6Quants + 64 * (24 * h + 16 + g); }
// q4_0, q5_0 and q5_1 panels (legacy.h) likewise, [P, nb, bytes] per block of 32: d[16] fp16, (q5_1: m[16] fp16,)
// (q5_0, q5_1: the 16 rows' 32-bit high-bit masks), then 4 groups of [16 rows][4 nibble bytes].
constexpr int kQ4_0Bytes = 16 * 18, kQ5_0Bytes = 16 * 22, kQ5_1Bytes = 16 * 24;

// y[T, n_out] = x[T, in] @ W^T over panels [p0, p1). Rows `ldx` / `ldy` floats apart.
// f32: w [P, in, 16] fp32.  f16, bf16: w [P, in, 16] fp16 / bf16 bits.
// q4: w the stream above; x is unused: act holds the 16-bit activations.
// int8: qs [P, nb, 8, 16, 4] bytes q+128, d [P, nb, 16] fp16; x is unused: qx [T, nb*32] int8,
//     dx [T, nb] and qoff [T, nb] = -128 * sum(qx of the block) come from quantize_rows.
// q8: the same weights as int8 against the 16-bit activations (act): a q4 model's LM head.
// q4_a8: q4's stream against the int8 activations (qx, dx, qoff), as llama.cpp runs Q4_1 on Q8_1's.
// q4_0, q5_0: w the stream above against the int8 activations (qx, dx, qoff), as llama.cpp runs them on Q8_0's.
// q5_1: likewise, its min folded as q4_a8's (fold), as llama.cpp runs Q5_1 on Q8_1's.
// q2_k, q3_k, q4_k, q5_k, q6_k: w the stream above; x is unused: qx [T, ns*256] int8, dx [T, ns] and xpair
//     [T, ns, kXPairs] (the sums of every 16 qx, paired) come from quantize_rows_k (llama.cpp's Q8_K).
struct LinearArgs {
  float* y;
  int64_t ldy;
  const float* x;
  int64_t ldx;
  int rows, in, n_out, nb;
  const void* w;        // f32 / f16 weights, the q4 stream, or the int8 and q8 bytes
  const uint16_t* d;    // fp16 block scales (int8, q8)
  const int8_t* qx;     // [T, nb*32] (int8)
  const float* dx;      // [T, nb] (int8)
  const int32_t* qoff;  // [T, nb] (int8)
  const float* fold;    // [nb, T, 2] (q4_a8, q5_1): each block's dx and dx * sum(qx), the rows of a block side by side
  const Act16* act;     // (q4, q8)
  const int32_t* xpair;  // [T, ns, kXPairs] (K-quants)
};
// A Q8_K super-block's sums of every 16 qx (|sum| <= 2032; of 32: <= 4064) as the int16 pairs S::min_dot takes
// against a vector of int16 pairs of scales or mins (one int32: the first sum in its low half), for every K-quant
// format's sub-blocks: from kXPair32, Q4_K / Q5_K's 32-input sub-blocks 2t and 2t + 1 (t < 4); from kXPairNext,
// 16-input sub-blocks 2t and 2t + 1 (Q2_K, Q6_K); from kXPairHalf, t and t + 8 (Q3_K). Made once per row and
// super-block by quantize_rows_k rather than in every panel's tile, which had packed them with scalar work for
// each of its rows: on the Xeon, passes of 6 / 16 rows from DRAM then took 0.91x / 0.89x the time on Q4_K and
// 0.93x / 0.94x on Q6_K (AVX2: 0.95-0.97x), decode steps level (bench.kernels_ab, 4 rounds).
constexpr int kXPair32 = 0, kXPairNext = 4, kXPairHalf = 12, kXPairs = 20;
using LinearFn = void (*)(const LinearArgs&, int64_t p0, int64_t p1);

// int8 activations, rows [r0, r1): qx, dx and qoff as LinearArgs describes; x [T, in], rows ldx apart.
using QuantizeRowsFn = void (*)(const float* x, int64_t ldx, int in, int nb, int8_t* qx, float* dx,
                                int32_t* qoff, int64_t r0, int64_t r1);
// Q8_K activations, rows [r0, r1): per super-block of 256 qx int8, dx, and the sums of every 16 qx paired (xpair).
using QuantizeRowsKFn = void (*)(const float* x, int64_t ldx, int in, int ns, int8_t* qx, float* dx, int32_t* xpair,
                                 int64_t r0, int64_t r1);
// 16-bit activations, rows [r0, r1), into the planes of Act16 this ISA's kernels read.
using QuantizeRows16Fn = void (*)(const float* x, int64_t ldx, int in, int nb, const Act16& a, int64_t r0,
                                  int64_t r1);

// residual (may be null) += x; then out = x-or-residual * rsqrt(mean(sq) + eps) * w, rows [r0, r1) of
// [rows, hidden] dense. out may alias x.
struct NormArgs {
  float* out;
  const float* x;
  float* residual;
  const float* w;
  int hidden;
  float eps;
};
using NormFn = void (*)(const NormArgs&, int64_t r0, int64_t r1);

// out[r, :I] = silu(gate_up[r, :I]) * gate_up[r, I:], rows [r0, r1), both dense (and gelu_tanh the same way).
using SiluMulFn = void (*)(float* out, const float* gate_up, int inter, int64_t r0, int64_t r1);
// A span v[0, n) of a logsumexp or softmax row -> its max m and s = sum e^(c (v - m)), and those terms into out
// unless it is null (rowwise.h exp_span).
using ExpSpanFn = void (*)(const float* v, int n, float c, float* out, float* m, float* s);

// A sampled pick under top-k / top-p (rowwise.h; csrc/cpu/nucleus.h runs them): y = x / tau and y's max (NaN when
// y is not all finite); the terms e^(y - m) into e and their sum in doubles.
using ScaleMaxFn = float (*)(const float* x, int n, float tau, float* y);
using ExpTotalFn = double (*)(const float* y, int n, float m, float* e);
// How many y >= floor; with e, also the sum of their e (an estimate, in float lanes) into mass.
using AboveFn = int64_t (*)(const float* y, const float* e, int n, float floor, float* mass);
// The indices of y >= floor, in order, into at (room for n); returns how many.
using CollectFn = int (*)(const float* y, int n, float floor, int32_t* at);

// Rotary embedding in place on tokens [t0, t1): q [N, H, D] and k [N, Hkv, D] with dense heads and token
// strides q_stride / k_stride; cos, sin [max_pos, D/2]; pos[t] as int64 (the host converts int32).
struct RopeArgs {
  float* q;
  float* k;
  const float* cos;
  const float* sin;
  const int64_t* pos;
  int n_heads, n_kv_heads, head_dim;
  int64_t q_stride, k_stride, max_pos;
};
using RopeFn = void (*)(const RopeArgs&, int64_t t0, int64_t t1);

// Attention of T new queries per row over the live keys of a [B, Hkv, S, D] cache, flash-decoding style:
// work item (b, kv head, split) covers the row's live keys at positions [split_start(split), split_start(split +
// 1)) for the kv head's whole GQA group (n_rep heads x T queries), so each K/V row is read once for all of them.
// It writes unnormalised partials (m, l, acc) into the workspace; merge folds the splits of each (b, t, h) into
// out. The splits sit at fixed positions, whatever T, the row's length or the thread count, so a query's sums
// run in the same order in a decode step and in every verify pass (attention.h). They double in size every
// four: 64 keys up to position 256, then 128, 256, ...: a short context still gives the threads several items
// each, and a long one no more than ~4 log2(length / 256) partials for the merge.
constexpr int split_start(int split) {
  const int group = split / 4;
  return 256 * ((1 << group) - 1) + 64 * (split % 4) * (1 << group);
}
// The splits covering positions [0, len).
constexpr int splits_for(int len) {
  int s = 0;
  while (split_start(s) < len) ++s;
  return s;
}
struct AttentionArgs {
  float* out;             // [B, T, H, D]: strides out_b, out_t; heads dense
  const float* q;         // [B, T, H, D]: strides q_b, q_t; heads dense
  const void* k;          // [B, Hkv, S, D]: strides kv_b, kv_h, kv_s (elements); D dense; fp32, or fp16 with kv_f16
  const void* v;          // same strides and element type as k
  const int32_t* seq_lens;  // [B] live length, the T new tokens included
  float* part_acc;        // [B, Hkv, splits, n_rep * T, D]
  float* part_ml;         // [B, Hkv, splits, n_rep * T, 2]: max and sum of exp, -inf / 0 when empty
  // splits: splits_for(the longest row)
  int batch, tokens, n_heads, n_kv_heads, head_dim, max_len, splits, window, sinks;
  int64_t q_b, q_t, out_b, out_t, kv_b, kv_h, kv_s;
  float scale;
  bool kv_f16;             // the cache holds fp16 (IEEE half) values, widened exactly as they are read
};
using AttentionFn = void (*)(const AttentionArgs&, int64_t item0, int64_t item1);       // items b, kvh, split
using AttentionMergeFn = void (*)(const AttentionArgs&, int64_t row0, int64_t row1);     // rows b, t, h

// One per instruction set, its fields set by name (designated initializers) in kernels_<isa>.cpp.
struct KernelTable {
  const char* name;  // what isa() reports
  std::array<LinearFn, kNumFormats> linear;  // by Format
  QuantizeRowsFn quantize_rows;
  QuantizeRows16Fn quantize_rows16;
  QuantizeRowsKFn quantize_rows_k;
  NormFn norm;
  SiluMulFn silu_mul;
  SiluMulFn gelu_tanh_mul;
  ExpSpanFn exp_span;
  ScaleMaxFn scale_max;
  ExpTotalFn exp_total;
  AboveFn above;
  CollectFn collect;
  RopeFn rope;
  AttentionFn attention;
  AttentionMergeFn attention_merge;
};

// out[i - i0] = -log(u_i) for i in [i0, i1), the sampling noise of one position's key (noise.h); AVX2, the floor.
void exp_noise(uint32_t key_lo, uint32_t key_hi, float* out, int64_t i0, int64_t i1);
// The largest w[i] / (that noise's value at i) for i in [i0, i1) and the first i holding it (noise.h race_keyed_span).
void race_keyed(uint32_t key_lo, uint32_t key_hi, const float* w, int64_t i0, int64_t i1, float* best, int64_t* at);

const KernelTable& avx2_table();    // kernels_avx2.cpp: AVX2 + FMA + F16C
const KernelTable& avx512_table();  // kernels_avx512.cpp: AVX-512 F/BW/VL/DQ + VNNI
const KernelTable& amx_table();     // kernels_amx.cpp: the avx512 table, q4 and q8 on AMX-INT8 tiles from T rows up

}  // namespace decodescope::cpu
