// ParallelFor: run fn(begin, end) over [0, n) in chunks of `grain` items on std::threads.
// Each item is handled by exactly one call, so kernels whose items write disjoint outputs
// stay bitwise deterministic whatever the thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace forge::cpu {

template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t n_threads = std::min(hw, chunks);
  if (n_threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  // Chunks are handed out dynamically (causal attention rows are uneven); which thread takes
  // a chunk does not change what that chunk computes.
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      fn(c * grain, std::min(n, (c + 1) * grain));
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(n_threads - 1);
  for (int64_t t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
}

}  // namespace forge::cpu
