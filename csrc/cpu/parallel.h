// Splitting a kernel's work items across threads, in the torch-facing host code.
//
// Threads come from our own pool (pool.h), sized by at::get_num_threads() so torch.set_num_threads
// still rules. Against at::parallel_for (torch's OpenMP, OMP_WAIT_POLICY=PASSIVE as the engine sets it),
// on the 2-core Zen 4 box: a decode-like q4 step (30 layers of norm, 4 GEMMs, rope, attention over 512
// keys, silu; ~180 parallel regions) took 6.1 ms median with the pool and 9.9 ms with OpenMP, whose
// sleeping worker costs ~5.5 us to wake and join per call. With one busy process competing for the
// cores both took 10.0 ms; with two, 25.8 (pool) and 22.7 ms (OpenMP).
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#include "pool.h"

namespace decodescope::cpu {

constexpr int kTasksPerThread = 4;  // a descheduled thread's share is taken over by the others

// fn(begin, end) over contiguous chunks of [0, n): at most threads * kTasksPerThread chunks, none
// smaller than min_chunk items (a chunk must outweigh the cost of handing it to another thread).
template <class Fn>
void parallel_chunks(int64_t n, int64_t min_chunk, const Fn& fn) {
  if (n <= 0) return;
  const int threads = at::get_num_threads();
  int64_t tasks = n / (min_chunk > 0 ? min_chunk : 1);
  if (tasks > threads * kTasksPerThread) tasks = threads * kTasksPerThread;
  if (tasks < 1) tasks = 1;
  if (threads <= 1 || tasks == 1) return fn(int64_t{0}, n);
  struct Ctx {
    const Fn* fn;
    int64_t n, tasks;
  } ctx{&fn, n, tasks};
  run_tasks(threads, tasks, [](void* p, int64_t t) {
    const Ctx& c = *static_cast<const Ctx*>(p);
    (*c.fn)(c.n * t / c.tasks, c.n * (t + 1) / c.tasks);
  }, &ctx);
}

}  // namespace decodescope::cpu
