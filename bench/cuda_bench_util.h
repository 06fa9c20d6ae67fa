// Pieces the CUDA benchmark programs share (forge-gemm-bench, forge-wgmma-bench,
// forge-sdpa-bench): device buffers freed on every path, float -> bf16 rounding, random
// non-zero bf16 operands made on the device, the median of event-timed calls rotating over
// operand sets, bf16 results read back, and the relative difference of two results.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/cuda_check.h"

namespace forge::bench {

// Device memory freed on destruction.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr, o.bytes = 0; }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  // The memory as T* (what typed kernel interfaces take).
  template <typename T>
  T* As() const {
    return static_cast<T*>(p);
  }
};

inline Status Alloc(DevBuf* b, size_t bytes) {
  b->bytes = bytes;
  FORGE_CUDA_CHECK(cudaMalloc(&b->p, bytes));
  return Status::Ok();
}

// The bf16 bits of f, rounded to nearest even (finite f).
inline uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Random non-zero bf16 values (|v| in [0.25, 1), random sign), kept on the device and tiled
// into operands from a per-buffer offset: random-looking data without generating gigabytes
// on the host.
class RandomPool {
 public:
  static constexpr size_t kElems = size_t(8) << 20;

  Status Init() {
    std::mt19937_64 rng(12345);
    std::uniform_real_distribution<float> mag(0.25f, 1.0f);
    std::vector<uint16_t> host(kElems);
    for (uint16_t& h : host) {
      float v = mag(rng);
      if (rng() & 1) v = -v;
      h = Bf16Bits(v);
    }
    FORGE_RETURN_IF_ERROR(Alloc(&pool_, kElems * 2));
    FORGE_CUDA_CHECK(cudaMemcpy(pool_.p, host.data(), kElems * 2, cudaMemcpyHostToDevice));
    return Status::Ok();
  }

  // Fills `n` bf16 elements at `dst`, starting `seed`-dependently in the pool.
  Status Fill(void* dst, size_t n, uint64_t seed) const {
    size_t src = (seed * 2654435761u) % kElems;
    size_t done = 0;
    auto* out = static_cast<uint16_t*>(dst);
    const auto* in = static_cast<const uint16_t*>(pool_.p);
    while (done < n) {
      const size_t len = std::min(n - done, kElems - src);
      FORGE_CUDA_CHECK(cudaMemcpy(out + done, in + src, len * 2, cudaMemcpyDeviceToDevice));
      done += len;
      src = (src + len + 7919) % kElems;
    }
    return Status::Ok();
  }

 private:
  DevBuf pool_;
};

// Median time per call of launch(set), calls rotating over `sets`: `warmup` untimed calls
// (sets 0, 1, ...), then `reps` timed ones going on from there ((warmup + r) % sets).
// Events::kPaired records an event before and one after every timed call; kBackToBack one
// before the first and one after each, so a call's time starts where the one before ended
// (where the GPU waits on the host between calls, that wait counts too).
class Timer {
 public:
  enum class Events { kPaired, kBackToBack };

  Timer(cudaStream_t s, int warmup, int reps, int sets, Events events = Events::kPaired)
      : s_(s), warmup_(warmup), reps_(reps), sets_(sets), events_(events) {}
  ~Timer() {
    for (cudaEvent_t e : ev_) cudaEventDestroy(e);
    for (cudaEvent_t e : pair_ev_) cudaEventDestroy(e);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  // Median microseconds per call.
  StatusOr<float> Median(const std::function<Status(int)>& launch) {
    FORGE_ASSIGN_OR_RETURN(const float ms, MedianMs(launch));
    return ms * 1000.0f;  // x * 1000 is monotonic: still the median of the microseconds
  }

  // Median microseconds per call of each of two launches timed interleaved: every rep runs
  // both, in turn first (a b, b a, ...), each between its own pair of events. Timed one after
  // the other, the second would run in the power state the first left (a step at these sizes
  // holds the 700 W cap, and the clock it settles at is not the clock of a cool start); here
  // both see the same drift. Same warmup, reps and operand sets as Median.
  StatusOr<std::pair<float, float>> MedianPair(const std::function<Status(int)>& a,
                                               const std::function<Status(int)>& b) {
    if (pair_ev_.empty()) {
      pair_ev_.resize(4 * size_t(reps_));
      for (cudaEvent_t& e : pair_ev_) FORGE_CUDA_CHECK(cudaEventCreate(&e));
    }
    for (int w = 0; w < warmup_; ++w) {
      FORGE_RETURN_IF_ERROR(a(w % sets_));
      FORGE_RETURN_IF_ERROR(b(w % sets_));
    }
    for (int r = 0; r < reps_; ++r) {
      const int set = (warmup_ + r) % sets_;
      cudaEvent_t* ev = &pair_ev_[4 * size_t(r)];  // a's start and end, then b's
      auto timed = [&](bool run_a) -> Status {
        FORGE_CUDA_CHECK(cudaEventRecord(ev[run_a ? 0 : 2], s_));
        FORGE_RETURN_IF_ERROR(run_a ? a(set) : b(set));
        FORGE_CUDA_CHECK(cudaEventRecord(ev[run_a ? 1 : 3], s_));
        return Status::Ok();
      };
      const bool a_first = r % 2 == 0;
      FORGE_RETURN_IF_ERROR(timed(a_first));
      FORGE_RETURN_IF_ERROR(timed(!a_first));
    }
    FORGE_CUDA_CHECK(cudaStreamSynchronize(s_));
    std::vector<float> ms_a(static_cast<size_t>(reps_)), ms_b(ms_a.size());
    for (size_t r = 0; r < ms_a.size(); ++r) {
      const cudaEvent_t* ev = &pair_ev_[4 * r];
      FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms_a[r], ev[0], ev[1]));
      FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms_b[r], ev[2], ev[3]));
    }
    return std::pair<float, float>(MedianOf(std::move(ms_a)) * 1000.0f,
                                   MedianOf(std::move(ms_b)) * 1000.0f);
  }

  // Median milliseconds per call, as cudaEventElapsedTime gives them.
  StatusOr<float> MedianMs(const std::function<Status(int)>& launch) {
    // Timed call r runs from event stride * r to the next one.
    const size_t stride = events_ == Events::kPaired ? 2 : 1;
    if (ev_.empty()) {
      ev_.resize(stride == 2 ? 2 * size_t(reps_) : size_t(reps_) + 1);
      for (cudaEvent_t& e : ev_) FORGE_CUDA_CHECK(cudaEventCreate(&e));
    }
    for (int w = 0; w < warmup_; ++w) FORGE_RETURN_IF_ERROR(launch(w % sets_));
    for (int r = 0; r < reps_; ++r) {
      if (stride == 2 || r == 0) FORGE_CUDA_CHECK(cudaEventRecord(ev_[stride * size_t(r)], s_));
      FORGE_RETURN_IF_ERROR(launch((warmup_ + r) % sets_));
      FORGE_CUDA_CHECK(cudaEventRecord(ev_[stride * size_t(r) + 1], s_));
    }
    FORGE_CUDA_CHECK(cudaStreamSynchronize(s_));
    std::vector<float> ms(static_cast<size_t>(reps_));
    for (int r = 0; r < reps_; ++r) {
      const size_t start = stride * size_t(r);
      FORGE_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(r)], ev_[start], ev_[start + 1]));
    }
    return MedianOf(std::move(ms));
  }

 private:
  // The middle value (the upper one of an even count).
  static float MedianOf(std::vector<float> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }

  cudaStream_t s_;
  int warmup_, reps_, sets_;
  Events events_;
  std::vector<cudaEvent_t> ev_;
  std::vector<cudaEvent_t> pair_ev_;  // MedianPair's: four a rep
};

// n bf16 values at `dev` as floats (exact widening).
inline StatusOr<std::vector<float>> DownloadBf16(const void* dev, size_t n) {
  std::vector<uint16_t> h(n);
  FORGE_CUDA_CHECK(cudaMemcpy(h.data(), dev, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t{h[i]} << 16;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

// ||got - ref|| / ||ref||.
inline double RelDiff(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double(got[i]) - double(ref[i]);
    num += e * e;
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace forge::bench
