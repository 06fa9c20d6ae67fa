// The device FP8 scale update (kernels/cuda/fp8_scale_update) against the host recipe
// (worker/model/fp8_scaling) bit for bit over many steps: random amaxes with zeros, NaNs,
// Infs and extremes; scale, scale_inv, history, counters, and the amax slots reset; slots
// interleaved in one array; window 1 as the current recipe.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/fp8_scale_update.h"
#include "worker/model/fp8_scaling.h"

namespace forge {
namespace {

using test::DeviceBuffer;

static_assert(cuda::kFp8ScaleMin == kMinFp8Scale && cuda::kFp8ScaleMax == kMaxFp8Scale,
              "device and host clamps must agree");

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float RandomAmax(std::mt19937_64& rng) {
  std::uniform_int_distribution<int> kind(0, 19);
  std::lognormal_distribution<float> mag(0.0f, 4.0f);
  switch (kind(rng)) {
    case 0: return 0.0f;
    case 1: return std::numeric_limits<float>::quiet_NaN();
    case 2: return std::numeric_limits<float>::infinity();
    case 3: return 1e-39f;  // subnormal: the scale clamps
    case 4: return 3e38f;
    default: return mag(rng);
  }
}

void CheckAgainstHost(int64_t n, const Fp8ScalingParams& p, int steps, uint64_t seed,
                      bool current) {
  SCOPED_TRACE(::testing::Message() << "window " << p.amax_history << " margin " << p.margin
                                    << (current ? " (current)" : ""));
  const int64_t stride = 12;  // amax at 12i, scale at 12i + 4, scale_inv at 12i + 8
  std::vector<Fp8ScaleState> host(size_t(n), MakeFp8ScaleState(p));
  std::vector<float> slots(size_t(n * stride), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    slots[size_t(i * stride + 4)] = 1.0f;
    slots[size_t(i * stride + 8)] = 1.0f;
  }
  DeviceBuffer<float> d_slots(slots);
  DeviceBuffer<float> d_hist(std::vector<float>(size_t(n * p.amax_history), 0.0f));
  DeviceBuffer<int64_t> d_rec(std::vector<int64_t>(size_t(n), 0)),
      d_bad(std::vector<int64_t>(size_t(n), 0));
  cuda::Fp8ScaleUpdateArgs a;
  a.n = n, a.stride = stride;
  a.amax = d_slots.data(), a.scale = d_slots.data() + 4, a.scale_inv = d_slots.data() + 8;
  a.history = d_hist.data(), a.recorded = d_rec.data(), a.nonfinite = d_bad.data();
  a.window = p.amax_history, a.margin = p.margin, a.fp8_max = p.fp8_max;

  std::mt19937_64 rng(seed);
  for (int step = 0; step < steps; ++step) {
    slots = d_slots.Download();
    for (int64_t i = 0; i < n; ++i) {
      const float amax = RandomAmax(rng);
      slots[size_t(i * stride)] = amax;
      if (current) {
        UpdateCurrentScale(p, amax, &host[size_t(i)]);
      } else {
        RecordAmax(p, amax, &host[size_t(i)]);
      }
    }
    d_slots.Upload(slots);
    ASSERT_STATUS_OK(cuda::Fp8ScaleUpdate(a, nullptr));
    slots = d_slots.Download();
    for (int64_t i = 0; i < n; ++i) {
      const Fp8ScaleState& h = host[size_t(i)];
      ASSERT_EQ(slots[size_t(i * stride)], 0.0f) << "amax not reset, tensor " << i;
      ASSERT_EQ(BitsOf(slots[size_t(i * stride + 4)]), BitsOf(h.scale))
          << "step " << step << " tensor " << i << ": " << slots[size_t(i * stride + 4)]
          << " vs " << h.scale;
      ASSERT_EQ(BitsOf(slots[size_t(i * stride + 8)]), BitsOf(h.scale_inv))
          << "step " << step << " tensor " << i;
    }
  }
  const std::vector<int64_t> rec = d_rec.Download(), bad = d_bad.Download();
  const std::vector<float> hist = d_hist.Download();
  for (int64_t i = 0; i < n; ++i) {
    const Fp8ScaleState& h = host[size_t(i)];
    EXPECT_EQ(bad[size_t(i)], h.nonfinite_amax) << "tensor " << i;
    if (current) continue;  // the host's current recipe keeps no history
    EXPECT_EQ(rec[size_t(i)], h.recorded) << "tensor " << i;
    for (int k = 0; k < p.amax_history; ++k) {
      EXPECT_EQ(BitsOf(hist[size_t(i * p.amax_history + k)]), BitsOf(h.history[size_t(k)]))
          << "tensor " << i << " slot " << k;
    }
  }
}

TEST(GpuFp8ScaleUpdate, DelayedMatchesHostRecipe) {
  FORGE_SKIP_WITHOUT_GPU();
  Fp8ScalingParams p;
  p.amax_history = 5, p.margin = 1, p.fp8_max = 448.0f;
  CheckAgainstHost(37, p, 40, 1, false);
  p.amax_history = 16, p.margin = 0, p.fp8_max = 57344.0f;
  CheckAgainstHost(300, p, 40, 2, false);
}

TEST(GpuFp8ScaleUpdate, WindowOneIsTheCurrentRecipe) {
  FORGE_SKIP_WITHOUT_GPU();
  Fp8ScalingParams p;
  p.recipe = Fp8Recipe::kCurrent;
  p.amax_history = 1, p.margin = 2, p.fp8_max = 448.0f;
  CheckAgainstHost(50, p, 30, 3, true);
}

TEST(GpuFp8ScaleUpdate, RejectsBadArguments) {
  FORGE_SKIP_WITHOUT_GPU();
  cuda::Fp8ScaleUpdateArgs a;
  a.n = 3;
  EXPECT_EQ(cuda::Fp8ScaleUpdate(a, nullptr).code(), Code::kInvalidArgument);  // no arrays
  a.window = 0;
  EXPECT_EQ(cuda::Fp8ScaleUpdate(a, nullptr).code(), Code::kInvalidArgument);
  a.n = 0, a.window = 1;
  EXPECT_TRUE(cuda::Fp8ScaleUpdate(a, nullptr).ok());  // nothing to do
}

}  // namespace
}  // namespace forge
