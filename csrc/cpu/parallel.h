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

// fn(begin, end) over contiguous chunks of [0, n): at most threads * per_thread chunks, none smaller than
// min_chunk items (a chunk must outweigh the cost of handing it to another thread). Chunks are claimed
// from a shared counter, so a worker that is late (asleep, or its core taken) leaves its chunk to the
// others instead of holding them up.
//
// Weight streams want per_thread = 1, one contiguous half each on two cores: every extra chunk restarts
// the hardware and software prefetch streams, and with 4 chunks per thread a decode step's GEMMs took
// 5-10% longer (f16 at T = 6: 10.7 ms against 9.5 ms; q4 at T = 1: 3.76 against 3.44 ms).
template <class Fn>
void parallel_chunks(int64_t n, int64_t min_chunk, const Fn& fn, int per_thread = 1) {
  if (n <= 0) return;
  const int threads = at::get_num_threads();
  int64_t tasks = n / (min_chunk > 0 ? min_chunk : 1);
  if (tasks > static_cast<int64_t>(threads) * per_thread) tasks = static_cast<int64_t>(threads) * per_thread;
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
