// Just enough of the CUDA runtime to run this project's kernels on a CPU, for tests on machines without a
// GPU. Compiled by the host compiler with -DDECODESCOPE_CUDA_ON_CPU (common.cuh then includes this file).
//
// Every CUDA thread of a block is a ucontext coroutine on one OS thread; blocks run one after another
// (blocks are independent, so that is a legal schedule) and __shared__ becomes static storage, i.e. one
// copy for the running block. A thread runs until it blocks, so the synchronisation rules are checked
// exactly, and a break of them is reported instead of hanging:
//   __syncthreads   releases when every thread of the block waits at the same one (same source line); a
//                   thread that exits while others wait at a barrier is an error (CUDA leaves that undefined).
//   __shfl_xor_sync releases when every lane named in the mask waits with that mask; naming a lane that
//                   does not exist, has exited or waits elsewhere is an error, as is reading a lane outside it.
//   __syncthreads_or  as __syncthreads, and returns whether any thread passed a nonzero predicate.
//   cp.async        copies are deferred to the wait that covers them (the latest legal landing), or done at
//                   issue (the earliest) with set_schedule(eager_copies=true); misaligned copies are errors.
//                   A zero-fill tail (the fourth argument) is written as zeros and its source never read.
//   vectors         load_vec / store_vec at an address not aligned to their size are errors.
// Blocks run in grid order, or in reverse with set_schedule(..., reverse_blocks=true), so a kernel whose blocks
// hand work to the last one to finish (an arrival counter) is tested with either end of the grid last.
// atomicAdd and __threadfence are trivially exact with one block running at a time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>  // host-only here: dim3, cudaError_t; __global__ and __device__ expand to nothing
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)

using std::max;
using std::min;
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }

namespace cuda_on_cpu {

enum class Wait { running, barrier, lanes, done };

struct Copy {
  void* dst;
  const void* src;
  size_t bytes;  // copied from src; the zero-fill tail follows
  size_t zeros;
};

struct Thread {
  uint3 idx;
  unsigned linear;
  ucontext_t context;
  std::unique_ptr<char[]> stack;
  Wait wait = Wait::running;
  unsigned mask = 0;                          // lanes named by the shuffle this thread waits in
  int barrier_line = 0;                       // which __syncthreads the thread waits at
  int barrier_pred = 0, barrier_any = 0;      // __syncthreads_or: this thread's predicate, the block's OR
  std::vector<Copy> open;                     // cp.async copies issued since the last commit
  std::vector<std::vector<Copy>> committed;   // committed groups, oldest first
};

struct Block {
  dim3 grid, block;
  uint3 block_idx;
  std::vector<Thread> threads;
  Thread* current = nullptr;
  ucontext_t scheduler;
  std::function<void()> body;
  float slots[32][32];  // shuffle exchange, [warp][lane]
  std::string error;
};

inline Block* block_now = nullptr;
inline bool eager_copies = false, reverse_order = false, reverse_blocks = false;
inline std::string last_error;
inline int blocks_per_sm = 2;  // what the occupancy query answers (there is no SM to measure)

inline void set_schedule(bool eager, bool reverse, bool reverse_grid = false) {
  eager_copies = eager;
  reverse_order = reverse;
  reverse_blocks = reverse_grid;
}

inline void yield(Wait why, unsigned mask = 0) {
  Thread* t = block_now->current;
  t->wait = why;
  t->mask = mask;
  swapcontext(&t->context, &block_now->scheduler);
}

inline void fail(const std::string& what) {
  Block* b = block_now;
  const Thread* t = b->current;
  if (b->error.empty()) {
    b->error = what + " (block " + std::to_string(b->block_idx.x) + "," + std::to_string(b->block_idx.y) + "," +
               std::to_string(b->block_idx.z) + ", thread " + std::to_string(t->idx.x) + "," +
               std::to_string(t->idx.y) + "," + std::to_string(t->idx.z) + ")";
  }
  yield(Wait::done);  // never resumed: the launch stops at the first error
}

// A GPU faults on a vector load or store that is not aligned to its size; x86 would not notice.
inline void check_vector_alignment(const void* p, int bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes) {
    fail(std::to_string(bytes) + "-byte vector access at a misaligned address");
  }
}

inline void run_copy(const Copy& c) {
  std::memcpy(c.dst, c.src, c.bytes);
  std::memset(static_cast<char*>(c.dst) + c.bytes, 0, c.zeros);
}

inline void run_copies(std::vector<Copy>& group) {
  for (const Copy& c : group) run_copy(c);
  group.clear();
}

inline void trampoline() {
  Thread* t = block_now->current;
  block_now->body();
  while (!t->committed.empty()) {  // copies still in flight land anyway
    run_copies(t->committed.front());
    t->committed.erase(t->committed.begin());
  }
  run_copies(t->open);
  yield(Wait::done);
}

// Wakes the threads that can go on; returns false when none can (a deadlock, described in b.error).
inline bool release(Block& b) {
  bool woke = false;
  for (Thread& t : b.threads) {  // shuffles: every lane of the mask waits with the same mask
    if (t.wait != Wait::lanes) continue;
    const unsigned warp = t.linear / 32;
    bool all = true;
    for (unsigned lane = 0; lane < 32 && all; ++lane) {
      if (!(t.mask >> lane & 1u)) continue;
      const unsigned linear = warp * 32 + lane;
      all = linear < b.threads.size() && b.threads[linear].wait == Wait::lanes && b.threads[linear].mask == t.mask;
    }
    if (!all) continue;
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (t.mask >> lane & 1u) b.threads[warp * 32 + lane].wait = Wait::running;
    }
    woke = true;
  }
  if (woke) return true;
  size_t at_barrier = 0, done = 0;
  for (const Thread& t : b.threads) {
    at_barrier += t.wait == Wait::barrier;
    done += t.wait == Wait::done;
  }
  if (at_barrier == 0) {
    if (done < b.threads.size()) b.error = "__shfl_xor_sync mask names lanes that never join it";
    return false;
  }
  if (done > 0) {
    b.error = "a thread exited while others wait at __syncthreads";
    return false;
  }
  if (at_barrier < b.threads.size()) {
    b.error = "__syncthreads reached while other threads wait in a shuffle";
    return false;
  }
  for (const Thread& t : b.threads) {  // CUDA requires the same __syncthreads, not just any
    if (t.barrier_line != b.threads[0].barrier_line) {
      b.error = "threads wait at different __syncthreads (lines " + std::to_string(b.threads[0].barrier_line) +
                " and " + std::to_string(t.barrier_line) + ")";
      return false;
    }
  }
  int any = 0;
  for (const Thread& t : b.threads) any |= t.barrier_pred != 0;
  for (Thread& t : b.threads) {
    t.wait = Wait::running;
    t.barrier_any = any;
  }
  return true;
}

inline bool run_block(Block& b) {
  const unsigned n = b.block.x * b.block.y * b.block.z;
  b.threads.resize(n);
  for (unsigned i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.linear = i;
    t.idx = {i % b.block.x, i / b.block.x % b.block.y, i / (b.block.x * b.block.y)};
    constexpr size_t kStack = 64 * 1024;
    t.stack.reset(new char[kStack]);
    getcontext(&t.context);
    t.context.uc_stack.ss_sp = t.stack.get();
    t.context.uc_stack.ss_size = kStack;
    t.context.uc_link = nullptr;
    makecontext(&t.context, trampoline, 0);
  }
  block_now = &b;
  while (true) {
    for (unsigned k = 0; k < n; ++k) {
      Thread& t = b.threads[reverse_order ? n - 1 - k : k];
      if (t.wait != Wait::running) continue;
      b.current = &t;
      swapcontext(&b.scheduler, &t.context);
      if (!b.error.empty()) return false;
    }
    bool all_done = true;
    for (const Thread& t : b.threads) all_done = all_done && t.wait == Wait::done;
    if (all_done) return true;
    if (!release(b)) return false;
  }
}

// The stand-in for a <<<grid, block, 0, stream>>> launch.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t, Args... args) {
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
      grid.z > 65535) {
    last_error = "invalid launch configuration";
    return cudaErrorInvalidConfiguration;
  }
  const uint64_t n_blocks = uint64_t{grid.x} * grid.y * grid.z;
  for (uint64_t k = 0; k < n_blocks; ++k) {
    const uint64_t i = reverse_blocks ? n_blocks - 1 - k : k;
    Block b;
    b.grid = grid;
    b.block = block;
    b.block_idx = {static_cast<unsigned>(i % grid.x), static_cast<unsigned>(i / grid.x % grid.y),
                   static_cast<unsigned>(i / (uint64_t{grid.x} * grid.y))};
    b.body = [&] { kernel(args...); };
    if (!run_block(b)) {
      last_error = b.error;
      block_now = nullptr;
      return cudaErrorLaunchFailure;
    }
  }
  block_now = nullptr;
  return cudaSuccess;
}

}  // namespace cuda_on_cpu

#define threadIdx (cuda_on_cpu::block_now->current->idx)
#define blockIdx (cuda_on_cpu::block_now->block_idx)
#define blockDim (cuda_on_cpu::block_now->block)
#define gridDim (cuda_on_cpu::block_now->grid)

inline int sync_block(int line, int pred = 0) {
  cuda_on_cpu::Thread* t = cuda_on_cpu::block_now->current;
  t->barrier_line = line;
  t->barrier_pred = pred;
  cuda_on_cpu::yield(cuda_on_cpu::Wait::barrier);
  return t->barrier_any;
}
#define __syncthreads() sync_block(__LINE__)
#define __syncthreads_or(pred) sync_block(__LINE__, (pred))

inline void __threadfence() {}

inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}

template <typename T>
inline T __ldcg(const T* p) {
  return *p;
}

template <typename T>
inline T __ldcs(const T* p) {
  return *p;
}

inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t bytes = (uint64_t{y} << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>(bytes >> (8 * ((s >> (4 * i)) & 7)) & 0xffu) << (8 * i);
  return r;
}

// One rounding each, as on the GPU; the library is built with -ffp-contract=off, so no FMA merges them.
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

inline float __uint_as_float(unsigned x) {
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}

inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask, unsigned width = 32) {
  using namespace cuda_on_cpu;
  Block* b = block_now;
  const unsigned lane = b->current->linear % 32, warp = b->current->linear / 32;
  if (!(mask >> lane & 1u)) fail("__shfl_xor_sync called by a lane outside its mask");
  b->slots[warp][lane] = v;
  yield(Wait::lanes, mask);
  unsigned src = lane ^ static_cast<unsigned>(lane_mask);
  if (src / width > lane / width) src = lane;  // a later group of `width` lanes: CUDA returns the own value
  if (!(mask >> src & 1u)) fail("__shfl_xor_sync reads a lane outside the mask");
  const float r = b->slots[warp][src];
  yield(Wait::lanes, mask);  // nobody overwrites a slot before every lane has read
  return r;
}

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes, size_t zeros = 0) {
  using namespace cuda_on_cpu;
  if (reinterpret_cast<uintptr_t>(dst) % bytes || reinterpret_cast<uintptr_t>(src) % bytes) {
    fail("cp.async of " + std::to_string(bytes) + " bytes from or to a misaligned address");
  }
  if (zeros > bytes) fail("cp.async zero-fill of " + std::to_string(zeros) + " bytes exceeds the copy");
  const Copy c{dst, src, bytes - zeros, zeros};
  if (eager_copies) {
    run_copy(c);
  } else {
    block_now->current->open.push_back(c);
  }
}

inline void __pipeline_commit() {
  cuda_on_cpu::Thread* t = cuda_on_cpu::block_now->current;
  t->committed.push_back(std::move(t->open));
  t->open.clear();
}

inline void __pipeline_wait_prior(size_t prior) {
  cuda_on_cpu::Thread* t = cuda_on_cpu::block_now->current;
  while (t->committed.size() > prior) {
    cuda_on_cpu::run_copies(t->committed.front());
    t->committed.erase(t->committed.begin());
  }
}
