// The worker pool of pool.h.
//
// One job at a time. A 64-bit word holds (job number, task count, next task): a thread claims a task by
// a compare-exchange on it, so a worker that saw an old job can never claim a task of a newer one, and
// the job's function is read only after a successful claim, while the job cannot finish. The caller
// waits for `done` to reach the task count, never for the workers themselves.
#include "pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace decodescope::cpu {
namespace {

constexpr int kMaxTasks = 0xFFFF;

uint64_t pack(uint64_t job, uint64_t n, uint64_t next) { return job << 32 | n << 16 | next; }
uint32_t job_of(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
int64_t count_of(uint64_t w) { return static_cast<int64_t>(w >> 16 & 0xFFFF); }
int64_t next_of(uint64_t w) { return static_cast<int64_t>(w & 0xFFFF); }

std::atomic<int> g_spin_us{300};

// One step of a spin-wait. Mostly a pause; every 64th step gives the core away if another thread is
// waiting for it: on a machine busy with other work, the thread we wait for may be queued on this very
// core, and a pure spin would hold it off for a whole time slice. With nothing else runnable, sched_yield
// returns at once.
inline void relax(int i) {
  if (i % 64 == 0) sched_yield();
  else _mm_pause();
}

class Pool {
 public:
  // Runs tasks of the current job until none is left; true if it ran any.
  bool help(uint32_t job) {
    bool ran = false;
    uint64_t w = word_.load(std::memory_order_acquire);
    while (job_of(w) == job && next_of(w) < count_of(w)) {
      if (!word_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn_(ctx_, next_of(w));
      done_.fetch_add(1, std::memory_order_release);
      ran = true;
      w = word_.load(std::memory_order_acquire);
    }
    return ran;
  }

  void run(int n_threads, int64_t n_tasks, TaskFn fn, void* ctx) {
    grow(n_threads - 1);
    fn_ = fn;
    ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    const uint32_t job = ++job_;
    word_.store(pack(job, static_cast<uint64_t>(n_tasks), 0), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lock(mutex_); }
      wake_.notify_all();
    }
    help(job);
    for (int i = 1; done_.load(std::memory_order_acquire) < n_tasks; ++i) relax(i);
  }

 private:
  void grow(int n) {
    while (static_cast<int>(workers_.size()) < n) {
      workers_.emplace_back([this] { loop(); });
      workers_.back().detach();  // lives as long as the process; see reset_after_fork
    }
  }

  void loop() {
    uint32_t seen = job_of(word_.load(std::memory_order_acquire));
    for (;;) {
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(g_spin_us.load());
      uint32_t job = seen;
      for (int i = 1; (job = job_of(word_.load(std::memory_order_acquire))) == seen; ++i) {
        relax(i);
        if ((i & 255) == 0 && std::chrono::steady_clock::now() > spin_until) break;
      }
      if (job == seen) {  // idle for the whole spin: sleep until the next job is published
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return job_of(word_.load(std::memory_order_seq_cst)) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        job = job_of(word_.load(std::memory_order_acquire));
      }
      seen = job;
      help(job);
    }
  }

  std::atomic<uint64_t> word_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  uint32_t job_ = 0;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
};

Pool* g_pool = nullptr;  // never freed: detached workers use it until the process exits

// A forked child has the parent's memory but none of its threads: start a fresh pool there.
void reset_after_fork() { g_pool = nullptr; }

}  // namespace

void run_tasks(int n_threads, int64_t n_tasks, TaskFn fn, void* ctx) {
  static std::mutex one_job;
  static const bool registered = (pthread_atfork(nullptr, nullptr, reset_after_fork), true);
  (void)registered;
  // One thread, one task, more tasks than the word counts (callers size them far below), or the pool busy
  // with another caller's job (two Python threads, or a call from inside a task): run them here.
  std::unique_lock<std::mutex> lock(one_job, std::try_to_lock);
  if (n_threads <= 1 || n_tasks <= 1 || n_tasks > kMaxTasks || !lock.owns_lock()) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(ctx, t);
    return;
  }
  if (g_pool == nullptr) g_pool = new Pool();
  g_pool->run(n_threads, n_tasks, fn, ctx);
}

void set_spin_us(int us) { g_spin_us.store(us < 0 ? 0 : us); }
int spin_us() { return g_spin_us.load(); }

}  // namespace decodescope::cpu
