// Splitting a kernel's work items across threads, in the torch-facing host code.
//
// Threads come from our own pool (pool.h), sized by at::get_num_threads() so torch.set_num_threads
// still rules. A decode step opens ~180 parallel regions (30 layers of norm, 4 GEMMs, rope, attention,
// silu); torch's OpenMP (at::parallel_for, passive waits as the engine sets them) wakes and joins a
// sleeping worker for each, which cost a decode step more than a third of its time on two cores; the
// pool's workers spin briefly between regions instead (pool.h). Under competing load the two are alike.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#include "pool.h"

namespace decodescope::cpu {

// The least a row-wise op's thread chunk holds: a decode step's single row stays on the calling thread (a handoff
// costs more than normalizing 576 values); prefill's many rows are split. min_rows: that many values in rows.
inline constexpr int64_t kMinChunkElems = 16 << 10;

inline int64_t min_rows(int64_t row_elems) {
  return (kMinChunkElems + row_elems - 1) / (row_elems > 0 ? row_elems : 1);
}

// fn(begin, end) over contiguous chunks of [0, n): at most threads * per_thread chunks, none smaller than
// min_chunk items (a chunk must outweigh the cost of handing it to another thread). Chunks are claimed
// from a shared counter, so a worker that is late (asleep, or its core taken) leaves its chunk to the
// others instead of holding them up.
//
// Weight streams want per_thread = 1, one contiguous half each on two cores: every extra chunk restarts
// the hardware and software prefetch streams (4 chunks per thread made a decode step's GEMMs measurably
// slower).
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
