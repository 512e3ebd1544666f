// Software prefetch of the panel streams, shared by every GEMM tile (gemm.h, kquants.h, amx.h).
#pragma once

namespace decodescope::cpu {
namespace {

// Software prefetch of the weight stream, kPrefetch bytes ahead, into L2 (prefetcht1). A tile with two or
// more rows is compute-bound per panel (T FMAs per weight load), and without it the core stops issuing
// loads while it computes: with the hardware prefetcher alone a 6-row f16 step took nearly twice as long
// (8 KB ahead measured best; 1, 2 and 4 KB ahead and prefetcht0 all did worse). 1-row tiles gain too, in
// whole decode steps (a kernel timed alone in a loop finds part of its weights still in L3): the hardware
// prefetcher stops at each 4 KB page, the software one runs on across it.
constexpr int kPrefetch = 8192;
inline void prefetch(const void* p, int ahead = kPrefetch) {
  __builtin_prefetch(static_cast<const char*>(p) + ahead, 0, 2);
}

// The next unit of a stream into L1 (prefetcht0), beside prefetch()'s L2 stream: for a K-quant tile, whose
// super-block (2.3-3.4 KB) is the unit, the next one's lines asked for ahead of their loads streamed Q4_K
// 6% and Q6_K 8% faster on an AVX2 EPYC (24 matrices of Qwen2.5-1.5B's MLP shape through linear, the old and
// new sources in alternating processes); 16 KB ahead in L2 instead of 8 KB gave half of that, two
// super-blocks ahead in L1 nothing more. Both requests are made for one line at a time as the tile reads it
// (kquants.h stream_line), not for a whole super-block at its start.
inline void prefetch_l1(const void* p) { __builtin_prefetch(p, 0, 3); }

}  // namespace
}  // namespace decodescope::cpu
