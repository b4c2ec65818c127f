// A small fork-join helper over MLX's header-only ThreadPool, for kernels whose work splits into
// independent tasks (one (batch row, kv head) pair, a block of rows, ...).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>

namespace pagekernels::cpu {

// Threads a kernel may use: PAGEKERNELS_NUM_THREADS if set (>= 1), else the hardware's count.
int max_threads();

// Calls body(worker) for worker in [0, num_workers), worker 0 on the calling thread, and returns
// when all are done. Exceptions from any worker are rethrown here.
void run_workers(int num_workers, const std::function<void(int)>& body);

// Runs task(i, scratch) for i in [0, num_tasks), each worker with its own Scratch. Stays on the
// calling thread when the work (in multiply-adds) is too small to pay for waking workers.
template <typename Scratch, typename Task>
void parallel_tasks(int num_tasks, int64_t total_work, Task&& task) {
  constexpr int64_t kMinWorkPerThread = 1 << 17;
  int64_t by_work = total_work / kMinWorkPerThread;
  int workers = static_cast<int>(std::min<int64_t>({max_threads(), num_tasks, by_work}));
  if (workers <= 1) {
    Scratch scratch;
    for (int i = 0; i < num_tasks; ++i) task(i, scratch);
    return;
  }
  std::atomic<int> next{0};
  run_workers(workers, [&](int) {
    Scratch scratch;
    for (int i = next.fetch_add(1); i < num_tasks; i = next.fetch_add(1)) task(i, scratch);
  });
}

}  // namespace pagekernels::cpu
