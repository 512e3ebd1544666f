// A small persistent worker pool for the kernels' parallel loops: workers spin for a while after each
// job, then sleep. Torch-free; ops_*.cpp size it from at::get_num_threads() on every call.
//
// Why not at::parallel_for: see parallel.h for the measurements.
#pragma once

#include <cstdint>

namespace decodescope::cpu {

// fn(ctx, task) for task in [0, n_tasks), run by the caller and up to n_threads - 1 workers; returns
// when every task is done. Tasks are claimed one at a time from a shared counter, so a worker that is
// asleep or descheduled (another job on the core) delays nothing: the others take its share.
// A second caller while a job runs (another Python thread, or a task itself) runs its tasks inline.
using TaskFn = void (*)(void* ctx, int64_t task);
void run_tasks(int n_threads, int64_t n_tasks, TaskFn fn, void* ctx);

// How long an idle worker spins before it sleeps (microseconds); tests and benchmarks may change it.
void set_spin_us(int us);
int spin_us();

}  // namespace decodescope::cpu
