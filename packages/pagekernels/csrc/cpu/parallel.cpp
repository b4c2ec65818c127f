#include "cpu/parallel.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <future>
#include <thread>
#include <vector>

#include "mlx/threadpool.h"

namespace pagekernels::cpu {

int max_threads() {
  static const int threads = [] {
    if (const char* env = std::getenv("PAGEKERNELS_NUM_THREADS")) {
      int n = std::atoi(env);
      if (n >= 1) return n;
    }
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return threads;
}

namespace {
ThreadPool& helper_pool() {
  // The calling thread is a worker too, so the pool holds one thread fewer.
  static ThreadPool pool(std::max(1, max_threads() - 1));
  return pool;
}
}  // namespace

void run_workers(int num_workers, const std::function<void(int)>& body) {
  std::vector<std::future<void>> helpers;
  helpers.reserve(num_workers - 1);
  for (int w = 1; w < num_workers; ++w) helpers.push_back(helper_pool().enqueue(body, w));
  // Wait for every helper even if one throws: they all reference `body`.
  std::exception_ptr error;
  try {
    body(0);
  } catch (...) {
    error = std::current_exception();
  }
  for (auto& h : helpers) {
    try {
      h.get();
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace pagekernels::cpu
