// Small helpers shared by the GPU tests: skip without a device, RAII device buffers, random
// inputs, bf16 rounding on the host, and error measures against a float32 reference.
// Header-only; usable from .cu and .cc test files. Keep it small and stable: other tests
// depend on it.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/cuda/bf16.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/tma_map.h"  // CheckSm90

namespace forge::test {

inline bool HasCudaDevice() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace forge::test

// First line of every GPU test.
#define FORGE_SKIP_WITHOUT_GPU()                                            \
  do {                                                                      \
    if (!::forge::test::HasCudaDevice()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Skips where our Hopper kernels (the wgmma GEMMs, the attention backward) cannot run.
#define FORGE_SKIP_WITHOUT_SM90()                                                             \
  do {                                                                                        \
    FORGE_SKIP_WITHOUT_GPU();                                                                 \
    if (!::forge::cuda::CheckSm90("test").ok()) GTEST_SKIP() << "needs an sm_90 GPU (Hopper)"; \
  } while (0)

#define ASSERT_CUDA_OK(call)                                                    \
  do {                                                                          \
    cudaError_t _e = (call);                                                    \
    ASSERT_EQ(_e, cudaSuccess) << #call << ": " << cudaGetErrorString(_e);      \
  } while (0)

#define ASSERT_STATUS_OK(expr)                                  \
  do {                                                          \
    ::forge::Status _s = (expr);                                \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.ToString();     \
  } while (0)
// The non-fatal form (usable in lambdas that return a value).
#define EXPECT_STATUS_OK(expr)                                  \
  do {                                                          \
    ::forge::Status _s = (expr);                                \
    EXPECT_TRUE(_s.ok()) << #expr << ": " << _s.ToString();     \
  } while (0)

namespace forge::test {

using bf16 = ::forge::cuda::bf16;

// Device memory for n elements of T, freed on destruction. Errors abort the test through
// gtest's ADD_FAILURE (constructors cannot ASSERT).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n == 0) return;
    cudaError_t e = cudaMalloc(&p_, n * sizeof(T));
    if (e != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc(" << n * sizeof(T) << "): " << cudaGetErrorString(e);
      p_ = nullptr;
    }
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFree(p_);
      p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  void Upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), n_) << "upload size mismatch";
    if (!p_ || host.size() != n_) return;
    cudaError_t e = cudaMemcpy(p_, host.data(), bytes(), cudaMemcpyHostToDevice);
    EXPECT_EQ(e, cudaSuccess) << "upload: " << cudaGetErrorString(e);
  }
  // Synchronises the device first so results of async kernels are complete.
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (!p_) return host;
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT_EQ(e, cudaSuccess) << "sync before download: " << cudaGetErrorString(e);
    e = cudaMemcpy(host.data(), p_, bytes(), cudaMemcpyDeviceToHost);
    EXPECT_EQ(e, cudaSuccess) << "download: " << cudaGetErrorString(e);
    return host;
  }
  // Fills every byte with 0xFF: a NaN in both fp32 and bf16, so any element a kernel should
  // have written but did not shows up as non-finite.
  void Poison() {
    if (!p_) return;
    cudaError_t e = cudaMemset(p_, 0xFF, bytes());
    EXPECT_EQ(e, cudaSuccess) << "poison: " << cudaGetErrorString(e);
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// ---- bf16 on the host (round to nearest even, as __float2bfloat16_rn) ---------------------

// Plain RoPE's inverse frequencies of theta on the device (rope.h's inv_freq), hd / 2 floats.
inline DeviceBuffer<float> RopeFreqs(int hd, float theta) {
  DeviceBuffer<float> f(size_t(hd / 2));
  const Status st = cuda::RopePlainInverseFrequencies(f.data(), hd, theta, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return f;
}

inline uint16_t FloatToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float Bf16BitsToFloat(uint16_t h) {
  uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float RoundBf16(float f) { return Bf16BitsToFloat(FloatToBf16Bits(f)); }

inline std::vector<bf16> ToBf16(const std::vector<float>& x) {
  static_assert(sizeof(bf16) == 2);
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    __nv_bfloat16_raw r;
    r.x = FloatToBf16Bits(x[i]);
    out[i] = bf16(r);
  }
  return out;
}
inline std::vector<float> ToFloat(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const __nv_bfloat16_raw r = x[i];
    out[i] = Bf16BitsToFloat(r.x);
  }
  return out;
}
// Rounds every element to bf16 in place (the reference then sees exactly the GPU's inputs).
inline void RoundBf16InPlace(std::vector<float>& x) {
  for (float& v : x) v = RoundBf16(v);
}

// ---- random inputs ------------------------------------------------------------------------

inline std::vector<float> RandomUniform(size_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}
inline std::vector<float> RandomNormal(size_t n, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}
// Random values that are exactly representable in bf16 (what a test uploads as bf16 and hands
// to the float32 reference unchanged).
inline std::vector<float> RandomNormalBf16(size_t n, float stddev, uint64_t seed) {
  std::vector<float> x = RandomNormal(n, stddev, seed);
  RoundBf16InPlace(x);
  return x;
}
inline std::vector<float> RandomUniformBf16(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<float> x = RandomUniform(n, lo, hi, seed);
  RoundBf16InPlace(x);
  return x;
}
inline std::vector<int32_t> RandomInts(size_t n, int32_t lo, int32_t hi_exclusive,
                                       uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi_exclusive - 1);
  std::vector<int32_t> x(n);
  for (int32_t& v : x) v = dist(rng);
  return x;
}

// ---- comparison ---------------------------------------------------------------------------

// Passes when every element of got is finite and max|got - ref| <= tol * max|ref| (the error
// relative to the reference's scale, which suits bf16 outputs whose error is relative to the
// magnitudes involved). The message names the worst element.
inline ::testing::AssertionResult MaxRelClose(const std::vector<float>& got,
                                              const std::vector<float>& ref, double tol) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure()
           << "size " << got.size() << " != reference size " << ref.size();
  }
  double max_ref = 0.0, max_err = 0.0;
  size_t worst = 0, nonfinite = 0, first_nonfinite = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    if (!std::isfinite(got[i])) {
      if (nonfinite++ == 0) first_nonfinite = i;
      continue;
    }
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    if (err > max_err) max_err = err, worst = i;
  }
  if (nonfinite > 0) {
    return ::testing::AssertionFailure()
           << nonfinite << " non-finite elements (unwritten?), first at " << first_nonfinite
           << " (ref " << ref[first_nonfinite] << ")";
  }
  const double scale = max_ref > 0.0 ? max_ref : 1.0;
  if (max_err > tol * scale) {
    return ::testing::AssertionFailure()
           << "max abs error " << max_err << " at " << worst << " (got " << got[worst]
           << ", ref " << ref[worst] << ") > " << tol << " * max|ref| " << scale;
  }
  return ::testing::AssertionSuccess() << "max abs error " << max_err << " / max|ref| " << scale;
}

// ||got - ref|| / ||ref|| (Frobenius, summed in double) over n elements; a non-finite `got`
// makes it infinite.
template <typename G, typename R>
double RelFrobenius(const G* got, const R* ref, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(double(got[i]))) return INFINITY;
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The same over ref.size() elements.
template <typename G, typename R>
double RelFrobenius(const std::vector<G>& got, const std::vector<R>& ref) {
  return RelFrobenius(got.data(), ref.data(), std::min(got.size(), ref.size()));
}

// The same 32 bits (NaNs included, +0 != -0).
inline bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <typename T>
bool BitwiseEqual(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Reference GEMM in double: D[M, N] = A * op(B) with A [M, K] (or [K, M] if trans_a) and B [N, K] (trans_b) or [K, N].
inline std::vector<double> RefGemm(const std::vector<float>& A, const std::vector<float>& B, int64_t M,
                            int64_t N, int64_t K, bool trans_a, bool trans_b) {
  std::vector<double> D(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = trans_a ? A[size_t(k * M + m)] : A[size_t(m * K + k)];
        const double b = trans_b ? B[size_t(n * K + k)] : B[size_t(k * N + n)];
        s += a * b;
      }
      D[size_t(m * N + n)] = s;
    }
  }
  return D;
}

}  // namespace forge::test
