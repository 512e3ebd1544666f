// Software prefetch of the panel streams, shared by every GEMM tile (gemm.h, kquant_base.h, kquants.h, amx.h).
#pragma once

namespace decodescope::cpu {
namespace {

// Software prefetch of the weight stream, kPrefetch bytes ahead, into L2 (prefetcht1). A tile with two or
// more rows is compute-bound per panel (T FMAs per weight load), and without it the core stops issuing
// loads while it computes: with the hardware prefetcher alone a 6-row f16 step took nearly twice as long
// (8 KB ahead measured best; 1, 2 and 4 KB ahead and prefetcht0 all did worse). 1-row tiles gain too, in
// whole decode steps (a kernel timed alone in a loop finds part of its weights still in L3): the hardware
// prefetcher stops at each 4 KB page, the software one runs on across it.
//
// Both are volatile asm, which the compiler keeps where the code puts them. As __builtin_prefetch (no operands
// the loads depend on) GCC's scheduler was free to move them, and in Q6_K's fully unrolled tile it gathered 96
// of them at the super-block's start, ahead of every load: Q6_K then streamed at 9-10 GB/s a core where Q4_K
// did 16 (an AVX2 EPYC), and at 12.5-14 with the requests left in their places; in whole 1.5B Q4_K_M steps
// Q6_K's part went from 10.4-12.9 GB/s to 16.8-18.3, the other formats' kernels unchanged.
constexpr int kPrefetch = 8192;
inline void prefetch(const void* p, int ahead = kPrefetch) {
  asm volatile("prefetcht1 %0" : : "m"(*(static_cast<const char*>(p) + ahead)));
}

// The next unit of a stream into L1 (prefetcht0), beside prefetch()'s L2 stream: for a K-quant tile, whose
// super-block (2.3-3.4 KB) is the unit, the next one's lines asked for ahead of their loads streamed Q4_K
// 6% and Q6_K 8% faster on an AVX2 EPYC (24 matrices of Qwen2.5-1.5B's MLP shape through linear, the old and
// new sources in alternating processes); 16 KB ahead in L2 instead of 8 KB gave half of that, two
// super-blocks ahead in L1 nothing more. Both requests are made for one line at a time as the tile reads it
// (kquant_base.h stream_line), not for a whole super-block at its start.
inline void prefetch_l1(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }

}  // namespace
}  // namespace decodescope::cpu
