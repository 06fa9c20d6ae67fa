// GPU FP8 casts (kernels/cuda/fp8_cast) against the CPU reference (kernels/cpu/fp8_cast) bit
// for bit: E4M3 and E5M2, random bf16 inputs of awkward shapes (not multiples of the 64x64
// tile or of the 8-element vector), values that tie, saturate or underflow, the transposed
// copies, fp32 master weights, the amax (exact, accumulated across casts, NaN/Inf propagated)
// and scale_inv. Outputs are poisoned first (0xFF is NaN in both formats), so an unwritten
// byte cannot pass for a zero.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/fp8_cast.h"
#include "kernels/cuda/fp8_cast.h"

namespace forge {
namespace {

using cuda::DType;
using test::bf16;
using test::DeviceBuffer;

cpu::Fp8Format HostFormat(DType t) {
  return t == DType::kE4M3 ? cpu::Fp8Format::kE4M3 : cpu::Fp8Format::kE5M2;
}
const char* Name(DType t) { return t == DType::kE4M3 ? "e4m3" : "e5m2"; }

// Equal bytes, except that where `want` is a NaN any NaN encoding passes (the GPU's canonical
// NaN sign is the hardware's business; the reference says 0x7F).
::testing::AssertionResult SameFp8(const std::vector<uint8_t>& got,
                                   const std::vector<uint8_t>& want, cpu::Fp8Format f) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  }
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (std::isnan(cpu::Fp8ToFloat(want[i], f)) && std::isnan(cpu::Fp8ToFloat(got[i], f))) {
      continue;
    }
    if (bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  char buf[160];
  std::snprintf(buf, sizeof(buf), "%zu of %zu bytes differ, first at %zu: got 0x%02X want 0x%02X",
                bad, got.size(), first, got[first], want[first]);
  return ::testing::AssertionFailure() << buf;
}

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Values whose product with a power-of-two scale ties, saturates, overflows or underflows in
// one or both formats (all exact in bf16).
std::vector<float> SpecialValues() {
  const float inf = std::numeric_limits<float>::infinity();
  return {0.0f,    -0.0f,    1.0f,      1.0625f,  1.1875f, -1.1875f, 1.125f,   1.375f,
          15.5f,   448.0f,   464.0f,    480.0f,   -464.0f, 500.0f,   57344.0f, 61440.0f,
          -61440.0f, 65536.0f, 1e6f,    -1e30f,   inf,     -inf,     0x1p-10f, 0x3p-10f,
          0x1p-17f, 0x3p-17f, 0x1p-9f,  -0x1p-16f, 0x1p-133f, 0.3f,    -7.0f,    2.0f};
}

// Random bf16 values (stddev 3) with the special values spread over the tensor.
std::vector<float> TestInput(size_t n, uint64_t seed, bool specials = true) {
  std::vector<float> x = test::RandomNormalBf16(n, 3.0f, seed);
  if (specials) {
    const std::vector<float> s = SpecialValues();
    for (size_t i = 0; i < s.size() && i < n; ++i) x[(i * 7919) % n] = s[i];
  }
  test::RoundBf16InPlace(x);
  return x;
}

struct Shape {
  int64_t rows, cols;
};

class GpuFp8Cast : public ::testing::Test {
 protected:
  void SetUp() override { FORGE_SKIP_WITHOUT_GPU(); }

  // Runs `cast` (which fills out/out_t/amax/scale_inv) and compares everything with the CPU
  // reference on `x` (float values of the GPU's input).
  template <typename Launch>
  void Check(const std::vector<float>& x, Shape s, DType fmt, float scale, bool want_out,
             bool want_t, Launch cast) {
    SCOPED_TRACE(::testing::Message() << Name(fmt) << " rows " << s.rows << " cols " << s.cols
                                      << " scale " << scale << " out " << want_out << " out_t "
                                      << want_t);
    const size_t n = size_t(s.rows * s.cols);
    DeviceBuffer<uint8_t> out(want_out ? n : 0), out_t(want_t ? n : 0);
    out.Poison();
    out_t.Poison();
    DeviceBuffer<float> d_scale(std::vector<float>{scale, 0, 0, 0});
    DeviceBuffer<float> d_amax(std::vector<float>{0, 0, 0, 0});
    DeviceBuffer<float> d_scale_inv(4);
    d_scale_inv.Poison();
    ASSERT_STATUS_OK(cast(want_out && n ? out.data() : nullptr,
                          want_t && n ? out_t.data() : nullptr, d_scale.data(), d_amax.data(),
                          d_scale_inv.data()));
    std::vector<uint8_t> ref(n), ref_t(n);
    const float ref_amax = cpu::CastToFp8(x.data(), s.rows, s.cols, scale, HostFormat(fmt),
                                          ref.data(), ref_t.data());
    if (want_out) EXPECT_TRUE(SameFp8(out.Download(), ref, HostFormat(fmt))) << "out";
    if (want_t) EXPECT_TRUE(SameFp8(out_t.Download(), ref_t, HostFormat(fmt))) << "out_t";
    const float amax = d_amax.Download()[0];
    if (std::isnan(ref_amax)) {
      EXPECT_TRUE(std::isnan(amax)) << amax;
    } else {
      EXPECT_EQ(BitsOf(amax), BitsOf(ref_amax)) << amax << " vs " << ref_amax;
    }
    EXPECT_EQ(BitsOf(d_scale_inv.Download()[0]), BitsOf(1.0f / scale));
  }
};

const Shape kCastShapes[] = {{1, 1},   {7, 13},  {1, 9},     {200, 136},
                             {3, 1000}, {65, 63}, {129, 257}, {0, 5}};

// (a) bf16 -> fp8, vectorised (rows * cols % 8 == 0) and scalar paths.
TEST_F(GpuFp8Cast, CastMatchesCpuBitForBit) {
  uint64_t seed = 100;
  for (DType fmt : {DType::kE4M3, DType::kE5M2}) {
    for (Shape s : kCastShapes) {
      const size_t n = size_t(s.rows * s.cols);
      const std::vector<float> x = TestInput(n, ++seed);
      DeviceBuffer<bf16> dx(test::ToBf16(x));
      // 1 and 0.5 keep the special values' ties; the third scale is the recipe's kind.
      for (float scale : {1.0f, 0.5f, 448.0f / 9.7f}) {
        Check(x, s, fmt, scale, true, false,
              [&](void* out, void*, const float* sc, float* amax, float* sinv) {
                return cuda::CastToFp8(out, dx.data(), s.rows, s.cols, fmt, sc, amax, sinv,
                                       nullptr);
              });
      }
    }
  }
}

// The vector path's conditions fail on an input 2 bytes into an allocation: the scalar path
// gives the same bytes.
TEST_F(GpuFp8Cast, MisalignedInputTakesTheScalarPath) {
  const Shape s{16, 24};
  const std::vector<float> x = TestInput(size_t(s.rows * s.cols), 7);
  std::vector<float> padded = {1.0f};
  padded.insert(padded.end(), x.begin(), x.end());
  DeviceBuffer<bf16> dx(test::ToBf16(padded));
  Check(x, s, DType::kE4M3, 3.0f, true, false,
        [&](void* out, void*, const float* sc, float* amax, float* sinv) {
          return cuda::CastToFp8(out, dx.data() + 1, s.rows, s.cols, DType::kE4M3, sc, amax,
                                 sinv, nullptr);
        });
}

// Multiples of 64 (64x64, 128x192, 256x64, 192x1024) take the vectorised tile kernel, the others
// the byte-wide one.
const Shape kTransposeShapes[] = {{1, 1},     {64, 64}, {65, 63},  {200, 136}, {129, 257},
                                  {1, 300},   {300, 1}, {2, 4100}, {0, 7},     {128, 192},
                                  {256, 64},  {192, 1024}};

// (b) bf16 -> fp8 and its transpose in one pass; each output alone too.
TEST_F(GpuFp8Cast, CastTransposeMatchesCpuBitForBit) {
  uint64_t seed = 200;
  for (DType fmt : {DType::kE4M3, DType::kE5M2}) {
    for (Shape s : kTransposeShapes) {
      const std::vector<float> x = TestInput(size_t(s.rows * s.cols), ++seed);
      DeviceBuffer<bf16> dx(test::ToBf16(x));
      auto launch = [&](void* out, void* out_t, const float* sc, float* amax, float* sinv) {
        return cuda::CastTransposeToFp8(out, out_t, dx.data(), s.rows, s.cols, fmt, sc, amax,
                                        sinv, nullptr);
      };
      Check(x, s, fmt, 0.5f, true, true, launch);
      Check(x, s, fmt, 448.0f / 11.3f, true, true, launch);
      Check(x, s, fmt, 2.0f, false, true, launch);
      Check(x, s, fmt, 2.0f, true, false, launch);
    }
  }
}

// (c) fp32 master weights (values not representable in bf16) -> fp8 and transposed fp8, with
// a few rows far beyond the format's range (saturated).
TEST_F(GpuFp8Cast, WeightCastFromFp32MatchesCpuBitForBit) {
  uint64_t seed = 300;
  for (DType fmt : {DType::kE4M3, DType::kE5M2}) {
    for (Shape s : {Shape{1024 + 3, 200}, Shape{136, 72}, Shape{5, 3}}) {
      std::vector<float> w = test::RandomNormal(size_t(s.rows * s.cols), 0.02f, ++seed);
      for (int64_t c = 0; c < s.cols; ++c) w[size_t(c)] *= 1e4f;  // row 0: saturates
      DeviceBuffer<float> dw(w);
      const float scale = cpu::Fp8Max(HostFormat(fmt)) / 0.1f;
      Check(w, s, fmt, scale, true, true,
            [&](void* out, void* out_t, const float* sc, float* amax, float* sinv) {
              return cuda::CastTransposeToFp8(out, out_t, dw.data(), s.rows, s.cols, fmt, sc,
                                              amax, sinv, nullptr);
            });
    }
  }
}

// Values beyond the format's max saturate to +-max (not Inf, not NaN), in both kernels.
TEST_F(GpuFp8Cast, SaturatesBeyondMax) {
  const std::vector<float> x = {1e4f, -1e4f, 70000.0f, -std::numeric_limits<float>::infinity()};
  DeviceBuffer<bf16> dx(test::ToBf16(x));
  DeviceBuffer<float> sc(std::vector<float>{1.0f, 0, 0, 0});
  DeviceBuffer<uint8_t> a(4), t(4);
  ASSERT_STATUS_OK(cuda::CastToFp8(a.data(), dx.data(), 1, 4, DType::kE4M3, sc.data(), nullptr,
                                   nullptr, nullptr));
  EXPECT_EQ(a.Download(), (std::vector<uint8_t>{0x7E, 0xFE, 0x7E, 0xFE}));
  ASSERT_STATUS_OK(cuda::CastTransposeToFp8(nullptr, t.data(), dx.data(), 1, 4, DType::kE5M2,
                                            sc.data(), nullptr, nullptr, nullptr));
  EXPECT_EQ(t.Download(), (std::vector<uint8_t>{0x71, 0xF1, 0x7B, 0xFB}));  // 1e4 -> 10240
}

// amax is max-accumulated: a larger value already there stays, a smaller one is raised, the
// amax-only pass (no output) agrees, and a NaN or Inf anywhere in the tensor makes it
// non-finite.
TEST_F(GpuFp8Cast, AmaxAccumulatesAndPropagatesNonFinite) {
  const Shape s{33, 70};
  std::vector<float> x = TestInput(size_t(s.rows * s.cols), 9, /*specials=*/false);
  DeviceBuffer<bf16> dx(test::ToBf16(x));
  const float amax_x = cpu::AbsMax(x.data(), int64_t(x.size()));
  DeviceBuffer<float> sc(std::vector<float>{1.0f, 0, 0, 0});
  DeviceBuffer<uint8_t> out(x.size()), out_t(x.size());
  for (const float prior : {0.0f, 1.0f, 1000.0f}) {
    DeviceBuffer<float> amax(std::vector<float>{prior, 0, 0, 0});
    ASSERT_STATUS_OK(cuda::CastToFp8(out.data(), dx.data(), s.rows, s.cols, DType::kE4M3,
                                     sc.data(), amax.data(), nullptr, nullptr));
    EXPECT_EQ(amax.Download()[0], std::max(prior, amax_x)) << "prior " << prior;
    ASSERT_STATUS_OK(cuda::CastTransposeToFp8(out.data(), out_t.data(), dx.data(), s.rows,
                                              s.cols, DType::kE4M3, sc.data(), amax.data(),
                                              nullptr, nullptr));
    EXPECT_EQ(amax.Download()[0], std::max(prior, amax_x)) << "prior " << prior;
    // Amax only (no output): the same value.
    DeviceBuffer<float> only(std::vector<float>{prior, 0, 0, 0});
    ASSERT_STATUS_OK(cuda::CastToFp8(nullptr, dx.data(), s.rows, s.cols, DType::kE4M3,
                                     sc.data(), only.data(), nullptr, nullptr));
    EXPECT_EQ(only.Download()[0], std::max(prior, amax_x)) << "amax only, prior " << prior;
  }
  for (const float bad : {std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<float> y = x;
    y[y.size() / 2] = bad;
    DeviceBuffer<bf16> dy(test::ToBf16(y));
    DeviceBuffer<float> a1(std::vector<float>{0, 0, 0, 0}), a2(std::vector<float>{0, 0, 0, 0});
    ASSERT_STATUS_OK(cuda::CastToFp8(out.data(), dy.data(), s.rows, s.cols, DType::kE5M2,
                                     sc.data(), a1.data(), nullptr, nullptr));
    ASSERT_STATUS_OK(cuda::CastTransposeToFp8(out.data(), out_t.data(), dy.data(), s.rows,
                                              s.cols, DType::kE5M2, sc.data(), a2.data(),
                                              nullptr, nullptr));
    for (float a : {a1.Download()[0], a2.Download()[0]}) {
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(a)) << a;
      } else {
        EXPECT_EQ(a, bad);
      }
    }
  }
}

// A layer's four weights in one launch (CastTransposeGroupToFp8) against four
// CastTransposeToFp8 calls: the same bytes both ways, and each tensor's own amax and scale_inv.
TEST_F(GpuFp8Cast, GroupCastMatchesSeparateCastsBitForBit) {
  struct Shape {
    int64_t rows, cols;
  };
  const std::vector<std::vector<Shape>> layers = {
      {{3072, 1024}, {1024, 1024}, {5632, 1024}, {1024, 2816}},  // gpt350m
      {{384, 128}, {128, 128}, {768, 128}, {128, 384}},         // the tiny test model
      {{64, 64}}};                                              // one tile
  uint64_t seed = 700;
  for (const auto& shapes : layers) {
    for (DType format : {DType::kE4M3, DType::kE5M2}) {
      SCOPED_TRACE(std::string(Name(format)) + ", " + std::to_string(shapes.size()) +
                   " tensors, first " + std::to_string(shapes[0].rows) + "x" +
                   std::to_string(shapes[0].cols));
      const int n = static_cast<int>(shapes.size());
      std::vector<std::unique_ptr<DeviceBuffer<bf16>>> x;
      std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> q, qt, q_ref, qt_ref;
      DeviceBuffer<float> slots(size_t(12 * n)), slots_ref(size_t(12 * n));
      std::vector<float> h(size_t(12 * n), 0.0f);
      for (int i = 0; i < n; ++i) h[12 * i] = 0.5f + float(i) * 3.0f;  // a scale each
      slots.Upload(h);
      slots_ref.Upload(h);
      std::vector<cuda::Fp8CastJob> jobs(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        const size_t e = size_t(shapes[i].rows * shapes[i].cols);
        x.push_back(std::make_unique<DeviceBuffer<bf16>>(
            test::ToBf16(test::RandomNormalBf16(e, 4.0f, ++seed))));
        for (auto* v : {&q, &qt, &q_ref, &qt_ref}) {
          v->push_back(std::make_unique<DeviceBuffer<uint8_t>>(e));
        }
        jobs[i] = cuda::Fp8CastJob{x[i]->data(), q[i]->data(), qt[i]->data(), shapes[i].rows,
                                   shapes[i].cols, slots.data() + 12 * i,
                                   slots.data() + 12 * i + 4, slots.data() + 12 * i + 8};
        ASSERT_STATUS_OK(cuda::CastTransposeToFp8(
            q_ref[i]->data(), qt_ref[i]->data(), x[i]->data(), shapes[i].rows, shapes[i].cols,
            format, slots_ref.data() + 12 * i, slots_ref.data() + 12 * i + 4,
            slots_ref.data() + 12 * i + 8, nullptr));
      }
      ASSERT_TRUE(cuda::CastTransposeGroupSupported(jobs.data(), n));
      ASSERT_STATUS_OK(cuda::CastTransposeGroupToFp8(jobs.data(), n, format, nullptr));
      for (int i = 0; i < n; ++i) {
        EXPECT_TRUE(q[i]->Download() == q_ref[i]->Download()) << "tensor " << i << " row-major";
        EXPECT_TRUE(qt[i]->Download() == qt_ref[i]->Download()) << "tensor " << i << " transposed";
      }
      const std::vector<float> got = slots.Download(), want = slots_ref.Download();
      EXPECT_TRUE(test::BitwiseEqual(got, want)) << "scale / amax / scale_inv slots";
      for (int i = 0; i < n; ++i) EXPECT_GT(got[12 * i + 4], 0.0f) << "tensor " << i << " amax";
    }
  }
  // Off the tile path (rows not a multiple of 64), or more than four tensors: refused.
  DeviceBuffer<bf16> x(size_t(96) * 64);
  DeviceBuffer<uint8_t> o(size_t(96) * 64), ot(size_t(96) * 64);
  DeviceBuffer<float> f(16);
  cuda::Fp8CastJob bad{x.data(), o.data(), ot.data(), 96, 64, f.data(), nullptr, nullptr};
  EXPECT_FALSE(cuda::CastTransposeGroupSupported(&bad, 1));
  EXPECT_FALSE(cuda::CastTransposeGroupToFp8(&bad, 1, DType::kE4M3, nullptr).ok());
  cuda::Fp8CastJob ok{x.data(), o.data(), ot.data(), 64, 64, f.data(), nullptr, nullptr};
  std::vector<cuda::Fp8CastJob> five(5, ok);
  EXPECT_FALSE(cuda::CastTransposeGroupSupported(five.data(), 5));
}

TEST_F(GpuFp8Cast, RejectsBadArguments) {
  DeviceBuffer<bf16> x(64);
  DeviceBuffer<float> w(64), f(16);
  DeviceBuffer<uint8_t> out(64);
  auto expect_invalid = [](const Status& st, const std::string& what) {
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  expect_invalid(cuda::CastToFp8(out.data(), x.data(), 8, 8, DType::kE4M3, f.data() + 1,
                                 nullptr, nullptr, nullptr),
                 "scale pointer must be 16-byte aligned");
  expect_invalid(cuda::CastToFp8(out.data(), x.data(), 8, 8, DType::kE4M3, f.data(),
                                 f.data() + 2, nullptr, nullptr),
                 "amax pointer must be 16-byte aligned");
  expect_invalid(cuda::CastTransposeToFp8(out.data(), nullptr, w.data(), 8, 8, DType::kE5M2,
                                          f.data(), f.data() + 4, f.data() + 9, nullptr),
                 "scale_inv pointer must be 16-byte aligned");
  expect_invalid(cuda::CastToFp8(out.data(), x.data(), 8, 8, DType::kBf16, f.data(), nullptr,
                                 nullptr, nullptr),
                 "E4M3 or E5M2");
  expect_invalid(cuda::CastToFp8(out.data(), x.data(), 8, 8, DType::kE4M3, nullptr, nullptr,
                                 nullptr, nullptr),
                 "scale pointer is required");
  expect_invalid(cuda::CastTransposeToFp8(nullptr, nullptr, x.data(), 8, 8, DType::kE4M3,
                                          f.data(), nullptr, nullptr, nullptr),
                 "no output");
  expect_invalid(cuda::CastToFp8(nullptr, x.data(), 8, 8, DType::kE4M3, f.data(), nullptr,
                                 nullptr, nullptr),
                 "neither out nor amax");
  expect_invalid(cuda::CastToFp8(out.data(), x.data(), -1, 8, DType::kE4M3, f.data(), nullptr,
                                 nullptr, nullptr),
                 "bad shape");
}

}  // namespace
}  // namespace forge
