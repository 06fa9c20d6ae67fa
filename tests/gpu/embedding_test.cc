// GPU embedding forward/backward vs the float32 CPU reference.
// Tolerances: forward is a gather, so bitwise equal to the bf16 table rows. Backward adds the
// same bf16-valued rows in the same (position) order as the CPU reference, so dwte is bitwise
// equal to cpu::EmbeddingBackward; the max-relative check (1e-6) is there to report the size
// of any difference. The sharded forms (fsdp's lookup in the slots) are held bitwise to the
// lookup in the whole bf16 table and to the sums they promise, computed here on the host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/embedding.h"
#include "worker/model/shard_layout.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

void CheckForward(int64_t N, int d, int V, uint64_t seed) {
  const std::vector<float> wte = test::RandomNormalBf16(size_t(V) * d, 1.0f, seed);
  const std::vector<int32_t> tokens = test::RandomInts(N, 0, V, seed + 1);
  DeviceBuffer<bf16> d_wte(test::ToBf16(wte));
  DeviceBuffer<int32_t> d_tok(tokens);
  DeviceBuffer<bf16> d_out(size_t(N) * d);
  d_out.Poison();
  ASSERT_STATUS_OK(cuda::EmbeddingForward(d_out.data(), d_tok.data(), d_wte.data(), N, d, nullptr));
  const std::vector<float> got = test::ToFloat(d_out.Download());
  std::vector<float> ref(size_t(N) * d);
  cpu::EmbeddingForward(ref.data(), tokens.data(), wte.data(), N, d);
  EXPECT_TRUE(test::MaxRelClose(got, ref, 0.0));
  EXPECT_TRUE(test::BitwiseEqual(got, ref));
}

TEST(GpuEmbeddingForward, RealisticShapeMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckForward(4 * 1024, 768, 50304, 11);
}

TEST(GpuEmbeddingForward, OddWidthScalarPathMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckForward(37, 100, 53, 12);
}

// The backward's scratch for N tokens, poisoned: the kernels must not depend on what it held.
DeviceBuffer<char> PoisonedWorkspace(int64_t N, int V) {
  const size_t bytes = cuda::EmbeddingBackwardWorkspace(N, V);
  EXPECT_GT(bytes, 0u);
  DeviceBuffer<char> ws(bytes);
  ws.Poison();
  return ws;
}

// Runs the GPU backward on a copy of dwte0 and returns the result.
std::vector<float> GpuBackward(const std::vector<float>& dwte0, const std::vector<bf16>& dout,
                               const std::vector<int32_t>& tokens, int64_t N, int d, int V) {
  DeviceBuffer<float> d_dwte(dwte0);
  DeviceBuffer<bf16> d_dout(dout);
  DeviceBuffer<int32_t> d_tok(tokens);
  DeviceBuffer<char> ws = PoisonedWorkspace(N, V);
  Status s = cuda::EmbeddingBackward(d_dwte.data(), d_dout.data(), d_tok.data(), N, d, V,
                                     ws.data(), ws.size(), nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return d_dwte.Download();
}

// Tokens with long runs of repeats (a few very frequent ids) as well as rare ones.
std::vector<int32_t> SkewedTokens(int64_t N, int V, uint64_t seed) {
  std::vector<int32_t> t = test::RandomInts(N, 0, V, seed);
  const std::vector<int32_t> pick = test::RandomInts(N, 0, 4, seed + 7);
  for (int64_t i = 0; i < N; ++i) {
    if (pick[i] == 0) t[i] = 3;            // ~25% of positions: one token
    if (pick[i] == 1) t[i] = t[i] % 16;    // ~25%: 16 tokens
  }
  t[0] = V - 1;  // the last row of the table
  return t;
}

void CheckBackward(int64_t N, int d, int V, uint64_t seed) {
  // dwte starts non-zero: the backward accumulates.
  const std::vector<float> dwte0 = test::RandomNormal(size_t(V) * d, 0.5f, seed);
  const std::vector<float> dout_f = test::RandomNormalBf16(size_t(N) * d, 1.0f, seed + 1);
  const std::vector<bf16> dout = test::ToBf16(dout_f);
  const std::vector<int32_t> tokens = SkewedTokens(N, V, seed + 2);

  const std::vector<float> got = GpuBackward(dwte0, dout, tokens, N, d, V);
  std::vector<float> ref = dwte0;
  cpu::EmbeddingBackward(ref.data(), dout_f.data(), tokens.data(), N, d);
  EXPECT_TRUE(test::MaxRelClose(got, ref, 1e-6));
  EXPECT_TRUE(test::BitwiseEqual(got, ref)) << "same additions in the same order as the CPU";

  // Deterministic: a second run gives the same bits.
  const std::vector<float> again = GpuBackward(dwte0, dout, tokens, N, d, V);
  EXPECT_TRUE(test::BitwiseEqual(got, again));
}

TEST(GpuEmbeddingBackward, RealisticShapeMatchesCpuAndIsDeterministic) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckBackward(4 * 1024, 768, 50304, 21);
}

TEST(GpuEmbeddingBackward, WideRowsMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckBackward(2 * 1024, 1024, 4096, 22);
}

TEST(GpuEmbeddingBackward, OddWidthScalarPathMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckBackward(300, 100, 50, 23);
}

TEST(GpuEmbeddingBackward, IgnoresOutOfRangeTokens) {
  FORGE_SKIP_WITHOUT_GPU();
  const int64_t N = 257;
  const int d = 64, V = 40;
  const std::vector<float> dwte0 = test::RandomNormal(size_t(V) * d, 0.5f, 31);
  const std::vector<float> dout_f = test::RandomNormalBf16(size_t(N) * d, 1.0f, 32);
  std::vector<int32_t> tokens = test::RandomInts(N, 0, V, 33);
  // Invalid ids with the same low bits as valid ones must not split a valid token's run.
  tokens[5] = -1;
  tokens[6] = V;
  tokens[7] = V + 3;
  tokens[100] = 1 << 20;
  const std::vector<float> got = GpuBackward(dwte0, test::ToBf16(dout_f), tokens, N, d, V);
  std::vector<float> ref = dwte0;
  for (int64_t n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= V) continue;
    cpu::EmbeddingBackward(ref.data(), dout_f.data() + n * d, &tokens[n], 1, d);
  }
  EXPECT_TRUE(test::BitwiseEqual(got, ref));
  EXPECT_TRUE(test::MaxRelClose(got, ref, 1e-6));
}

// Into a bf16 gradient (ddp's bf16 sum of a tied embedding): each touched row read, its
// tokens' rows added in fp32 in position order, rounded once: bitwise bf16(CPU reference
// started from the row's values); rows no token touches keep their bits.
void CheckBackwardBf16(int64_t N, int d, int V, uint64_t seed) {
  const std::vector<bf16> start = test::ToBf16(test::RandomNormalBf16(size_t(V) * d, 0.5f, seed));
  const std::vector<float> dout_f = test::RandomNormalBf16(size_t(N) * d, 1.0f, seed + 1);
  const std::vector<int32_t> tokens = SkewedTokens(N, V, seed + 2);
  DeviceBuffer<bf16> d_dwte(start);
  DeviceBuffer<bf16> d_dout(test::ToBf16(dout_f));
  DeviceBuffer<int32_t> d_tok(tokens);
  DeviceBuffer<char> ws = PoisonedWorkspace(N, V);
  ASSERT_STATUS_OK(cuda::EmbeddingBackward(d_dwte.data(), d_dout.data(), d_tok.data(), N, d, V,
                                           ws.data(), ws.size(), nullptr));
  std::vector<float> ref = test::ToFloat(start);
  cpu::EmbeddingBackward(ref.data(), dout_f.data(), tokens.data(), N, d);
  const std::vector<float> got = test::ToFloat(d_dwte.Download());
  EXPECT_TRUE(test::BitwiseEqual(got, test::ToFloat(test::ToBf16(ref))));
}

TEST(GpuEmbeddingBackward, IntoBf16IsTheCpuSumRoundedOnce) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckBackwardBf16(4 * 1024, 768, 50304, 41);
  CheckBackwardBf16(300, 100, 50, 42);  // scalar path
}

TEST(GpuEmbeddingBackward, RejectsTooSmallWorkspace) {
  FORGE_SKIP_WITHOUT_GPU();
  DeviceBuffer<float> dwte(64 * 8);
  DeviceBuffer<bf16> dout(16 * 8);
  DeviceBuffer<int32_t> tok(std::vector<int32_t>(16, 1));
  const size_t need = cuda::EmbeddingBackwardWorkspace(16, 64);
  DeviceBuffer<char> ws(need);
  Status s = cuda::EmbeddingBackward(dwte.data(), dout.data(), tok.data(), 16, 8, 64, ws.data(),
                                     need - 1, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
}

// fsdp's lookup in the slots: every rank writes the elements of all ranks' rows its slot holds
// (the rest -0); summed over the ranks in bf16 they are the rows of the whole table rounded to
// bf16, bit for bit, and each element came from exactly one rank.
void CheckRowsFromSlots(int64_t N, int d, int V, int world, uint64_t seed) {
  const std::vector<float> wte = test::RandomNormal(size_t(V) * d, 1.0f, seed);  // fp32 master
  const std::vector<int32_t> tokens = SkewedTokens(N, V, seed + 1);
  DeviceBuffer<int32_t> d_tok(tokens);
  const int64_t numel = int64_t{V} * d;
  std::vector<float> sum(size_t(N) * d, 0.0f);
  std::vector<int> owners(size_t(N) * d, 0);
  for (int r = 0; r < world; ++r) {
    const ShardRange range = ShardOf(numel, r, world);
    // The slot as fsdp holds it: ShardSize elements, the range's first at 0.
    std::vector<float> slot(size_t(ShardSize(numel, world)), 0.0f);
    std::memcpy(slot.data(), wte.data() + range.begin, size_t(range.size()) * sizeof(float));
    DeviceBuffer<float> d_slot(slot);
    DeviceBuffer<bf16> d_out(size_t(N) * d);
    d_out.Poison();
    ASSERT_STATUS_OK(cuda::EmbeddingRowsFromSlot(d_out.data(), d_tok.data(), N, d, d_slot.data(),
                                                 range.begin, range.end, nullptr));
    const std::vector<float> got = test::ToFloat(d_out.Download());
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(got[i] == 0.0f && std::signbit(got[i]))) ++owners[i];  // -0: not this rank's
      sum[i] = test::RoundBf16(sum[i] + got[i]);
    }
  }
  size_t wrong = 0, not_one = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int c = 0; c < d; ++c) {
      const size_t i = size_t(n) * d + size_t(c);
      const float want = test::RoundBf16(wte[size_t(tokens[size_t(n)]) * d + size_t(c)]);
      wrong += std::memcmp(&sum[i], &want, 4) != 0;
      not_one += owners[i] != 1 && want != 0.0f;
    }
  }
  EXPECT_EQ(wrong, 0u) << "elements whose summed rows differ from the bf16 table's";
  EXPECT_EQ(not_one, 0u) << "elements not held by exactly one rank";
}

TEST(GpuEmbeddingSlots, RowsFromTheSlotsSumToTheLookup) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckRowsFromSlots(2 * 1024, 256, 1152, 4, 51);  // vector path
  CheckRowsFromSlots(300, 100, 50, 3, 52);          // scalar path (d not a multiple of 8)
}

// fsdp's backward into the slots: every rank's rows (rank-major) into one rank's slot of the
// gradient. Per element: each rank's rows of its token summed in position order from zero,
// those sums added in rank order from zero, the total added to the slot's value; elements
// outside [lo, hi) untouched.
void CheckBackwardToSlot(int64_t per_rank, int world, int d, int V, int64_t lo, int64_t hi,
                         uint64_t seed) {
  const int64_t N = per_rank * world;
  const std::vector<float> dout_f = test::RandomNormalBf16(size_t(N) * d, 1.0f, seed);
  std::vector<int32_t> tokens = SkewedTokens(N, V, seed + 1);
  tokens[size_t(N / 2)] = V + 5;  // out of range: ignored
  const std::vector<float> slot0 = test::RandomNormal(size_t(hi - lo), 0.5f, seed + 2);
  DeviceBuffer<float> d_slot(slot0);
  DeviceBuffer<bf16> d_dout(test::ToBf16(dout_f));
  DeviceBuffer<int32_t> d_tok(tokens);
  DeviceBuffer<char> ws = PoisonedWorkspace(N, V);
  ASSERT_STATUS_OK(cuda::EmbeddingBackwardToSlot(d_slot.data(), lo, hi, d_dout.data(),
                                                 d_tok.data(), N, per_rank, d, V, ws.data(),
                                                 ws.size(), nullptr));
  std::vector<float> total(size_t(V) * d, 0.0f);
  std::vector<float> part(size_t(V) * d);
  for (int r = 0; r < world; ++r) {
    std::fill(part.begin(), part.end(), 0.0f);
    for (int64_t p = r * per_rank; p < (r + 1) * per_rank; ++p) {
      const int32_t t = tokens[size_t(p)];
      if (t < 0 || t >= V) continue;
      for (int c = 0; c < d; ++c) part[size_t(t) * d + c] += dout_f[size_t(p) * d + c];
    }
    for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
  }
  std::vector<float> want = slot0;
  for (int64_t e = lo; e < hi; ++e) want[size_t(e - lo)] += total[size_t(e)];
  EXPECT_TRUE(test::BitwiseEqual(d_slot.Download(), want));
}

TEST(GpuEmbeddingSlots, BackwardSumsEachRanksRowsThenTheRanks) {
  FORGE_SKIP_WITHOUT_GPU();
  const int V = 1152, d = 256;
  const int64_t numel = int64_t{V} * d;
  for (int r = 0; r < 4; ++r) {  // fsdp's slots over 4 ranks (vector path)
    const ShardRange s = ShardOf(numel, r, 4);
    CheckBackwardToSlot(512, 4, d, V, s.begin, s.end, 61 + r);
  }
  CheckBackwardToSlot(100, 3, 100, 50, 1234, 3977, 65);  // scalar path, an unaligned window
}

}  // namespace
}  // namespace forge
