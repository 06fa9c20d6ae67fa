// GPU fused softmax cross-entropy (loss + in-place bf16 gradient) and the deterministic mean,
// vs the float32 CPU reference on the same bf16 logits.
// Tolerances (max |got - ref| / max |ref|): losses (fp32 from bf16 inputs) 1e-5; gradient
// (bf16) 1e-2, checked twice: over the whole gradient (dominated by the -dloss at the target)
// and with the target entries left out (so the softmax part itself is held to 1e-2 of its
// largest value). Mean of fp32 values: 1e-5. The FP8 variant (the FP8 LM head's dgrad operand)
// must equal the plain kernel followed by CastToFp8 of its bf16 gradient, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/fp8_cast.h"

namespace forge {
namespace {

using test::bf16;
using test::DeviceBuffer;

// Copies of got/ref with each row's target entry zeroed.
void DropTargets(std::vector<float>* x, const std::vector<int32_t>& targets, int V) {
  for (size_t r = 0; r < targets.size(); ++r) {
    if (targets[r] >= 0 && targets[r] < V) (*x)[r * V + targets[r]] = 0.0f;
  }
}

void CheckCrossEntropy(int64_t n, int V, float logit_std, uint64_t seed) {
  SCOPED_TRACE("n=" + std::to_string(n) + " V=" + std::to_string(V));
  const float dloss = 1.0f / float(n);
  const std::vector<float> logits = test::RandomNormalBf16(size_t(n) * V, logit_std, seed);
  const std::vector<int32_t> targets = test::RandomInts(n, 0, V, seed + 1);
  std::vector<float> ref_loss(n), ref_grad(size_t(n) * V);
  cpu::CrossEntropyForwardBackward(ref_loss.data(), ref_grad.data(), logits.data(),
                                   targets.data(), n, V, dloss);

  DeviceBuffer<int32_t> d_tgt(targets);
  DeviceBuffer<float> d_loss(n);

  // Loss only: the logits stay as they were.
  DeviceBuffer<bf16> d_logits(test::ToBf16(logits));
  d_loss.Poison();
  ASSERT_STATUS_OK(cuda::CrossEntropyForwardBackward(d_logits.data(), d_loss.data(),
                                                     d_tgt.data(), n, V, dloss, false, nullptr));
  const std::vector<float> loss_only = d_loss.Download();
  EXPECT_TRUE(test::MaxRelClose(loss_only, ref_loss, 1e-5)) << "loss (no grad)";
  EXPECT_TRUE(test::BitwiseEqual(test::ToFloat(d_logits.Download()), logits))
      << "write_grad=false must not touch the logits";

  // Loss and gradient in place.
  d_loss.Poison();
  ASSERT_STATUS_OK(cuda::CrossEntropyForwardBackward(d_logits.data(), d_loss.data(),
                                                     d_tgt.data(), n, V, dloss, true, nullptr));
  const std::vector<float> loss = d_loss.Download();
  EXPECT_TRUE(test::MaxRelClose(loss, ref_loss, 1e-5)) << "loss";
  EXPECT_TRUE(test::BitwiseEqual(loss, loss_only)) << "same loss with and without the gradient";
  std::vector<float> grad = test::ToFloat(d_logits.Download());
  EXPECT_TRUE(test::MaxRelClose(grad, ref_grad, 1e-2)) << "dlogits";
  DropTargets(&grad, targets, V);
  DropTargets(&ref_grad, targets, V);
  EXPECT_TRUE(test::MaxRelClose(grad, ref_grad, 1e-2)) << "dlogits without the target entries";
}

TEST(GpuCrossEntropy, Gpt2VocabMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckCrossEntropy(4, 50304, 4.0f, 401);
}

TEST(GpuCrossEntropy, ManyRowsMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckCrossEntropy(64, 50304, 2.0f, 402);
}

TEST(GpuCrossEntropy, VocabBeyondRowCacheMatchesCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckCrossEntropy(3, 60000, 4.0f, 403);  // > 56320 columns: the tail is re-read from memory
}

TEST(GpuCrossEntropy, SmallAndOddVocabMatchCpu) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckCrossEntropy(5, 1003, 4.0f, 404);  // V % 8 != 0: scalar path
  CheckCrossEntropy(2, 8, 1.0f, 405);
  CheckCrossEntropy(9, 128, 8.0f, 406);
}

void CheckFp8Grad(int64_t n, int V, float scale, uint64_t seed) {
  SCOPED_TRACE("n=" + std::to_string(n) + " V=" + std::to_string(V));
  const float dloss = 1.0f / float(n);
  const std::vector<float> logits = test::RandomNormalBf16(size_t(n) * V, 4.0f, seed);
  const std::vector<int32_t> targets = test::RandomInts(n, 0, V, seed + 1);
  DeviceBuffer<int32_t> d_tgt(targets);
  DeviceBuffer<float> d_scale(std::vector<float>{scale});
  // Reference: the plain kernel, then the cast of its bf16 gradient.
  DeviceBuffer<bf16> ref_logits(test::ToBf16(logits));
  DeviceBuffer<float> ref_loss(n), ref_amax(std::vector<float>{0.0f}),
      ref_inv(std::vector<float>{0.0f});
  DeviceBuffer<uint8_t> ref_grad8(size_t(n) * V);
  ASSERT_STATUS_OK(cuda::CrossEntropyForwardBackward(ref_logits.data(), ref_loss.data(),
                                                     d_tgt.data(), n, V, dloss, true, nullptr));
  ASSERT_STATUS_OK(cuda::CastToFp8(ref_grad8.data(), ref_logits.data(), n, V, cuda::DType::kE5M2,
                                   d_scale.data(), ref_amax.data(), ref_inv.data(), nullptr));
  // Fused, with and without the bf16 dlogits (without: the logits stay as they were).
  for (const bool write_bf16 : {true, false}) {
    SCOPED_TRACE(write_bf16 ? "bf16 and E5M2 dlogits" : "E5M2 dlogits only");
    DeviceBuffer<bf16> got_logits(test::ToBf16(logits));
    DeviceBuffer<float> got_loss(n), got_amax(std::vector<float>{0.0f}),
        got_inv(std::vector<float>{0.0f});
    DeviceBuffer<uint8_t> got_grad8(size_t(n) * V);
    ASSERT_TRUE(cuda::CrossEntropyFp8GradSupported(V, got_logits.data(), got_grad8.data()));
    ASSERT_STATUS_OK(cuda::CrossEntropyForwardBackwardFp8Grad(
        got_logits.data(), got_loss.data(), d_tgt.data(), n, V, dloss, got_grad8.data(),
        d_scale.data(), got_amax.data(), got_inv.data(), write_bf16, nullptr));
    EXPECT_TRUE(test::BitwiseEqual(got_loss.Download(), ref_loss.Download())) << "losses";
    EXPECT_TRUE(test::BitwiseEqual(test::ToFloat(got_logits.Download()),
                                   write_bf16 ? test::ToFloat(ref_logits.Download()) : logits))
        << (write_bf16 ? "bf16 dlogits" : "logits changed");
    EXPECT_EQ(got_grad8.Download(), ref_grad8.Download()) << "E5M2 dlogits";
    EXPECT_TRUE(test::BitwiseEqual(got_amax.Download(), ref_amax.Download()))
        << got_amax.Download()[0] << " vs " << ref_amax.Download()[0];
    EXPECT_GT(got_amax.Download()[0], 0.0f);
    EXPECT_TRUE(test::BitwiseEqual(got_inv.Download(), ref_inv.Download())) << "scale_inv";
  }
}

TEST(GpuCrossEntropy, Fp8GradIsTheCastOfTheBf16Grad) {
  FORGE_SKIP_WITHOUT_GPU();
  CheckFp8Grad(64, 50304, 4096.0f, 408);
  CheckFp8Grad(3, 60000, 65536.0f, 409);   // beyond the row cache
  CheckFp8Grad(16, 512, 1.0e6f, 410);      // saturating scale: large values clip to E5M2's max
  EXPECT_FALSE(cuda::CrossEntropyFp8GradSupported(1003, nullptr, nullptr));
}

TEST(GpuCrossEntropy, OutOfRangeTargetGivesNanLossAndNoOnehot) {
  FORGE_SKIP_WITHOUT_GPU();
  const int64_t n = 2;
  const int V = 256;
  const float dloss = 0.5f;
  const std::vector<float> logits = test::RandomNormalBf16(size_t(n) * V, 2.0f, 407);
  const std::vector<int32_t> targets = {-1, V};
  DeviceBuffer<bf16> d_logits(test::ToBf16(logits));
  DeviceBuffer<int32_t> d_tgt(targets);
  DeviceBuffer<float> d_loss(n);
  ASSERT_STATUS_OK(cuda::CrossEntropyForwardBackward(d_logits.data(), d_loss.data(),
                                                     d_tgt.data(), n, V, dloss, true, nullptr));
  const std::vector<float> loss = d_loss.Download();
  EXPECT_TRUE(std::isnan(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]));
  // Gradient = softmax * dloss: the reference with target 0, plus dloss back at column 0.
  std::vector<float> ref_loss(n), ref_grad(size_t(n) * V);
  const std::vector<int32_t> zero(n, 0);
  cpu::CrossEntropyForwardBackward(ref_loss.data(), ref_grad.data(), logits.data(), zero.data(),
                                   n, V, dloss);
  for (int64_t r = 0; r < n; ++r) ref_grad[r * V] += dloss;
  EXPECT_TRUE(test::MaxRelClose(test::ToFloat(d_logits.Download()), ref_grad, 1e-2));
}

TEST(GpuMeanReduce, MatchesDoubleMeanAndIsDeterministic) {
  FORGE_SKIP_WITHOUT_GPU();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{4097}, int64_t{100000}}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> v = test::RandomUniform(n, 0.5f, 12.0f, 500 + n);
    double sum = 0.0;
    for (float x : v) sum += x;
    DeviceBuffer<float> d_v(v), d_out(1);
    d_out.Poison();
    ASSERT_STATUS_OK(cuda::MeanReduce(d_out.data(), d_v.data(), n, nullptr));
    const std::vector<float> got = d_out.Download();
    EXPECT_TRUE(test::MaxRelClose(got, {float(sum / double(n))}, 1e-5));
    d_out.Poison();
    ASSERT_STATUS_OK(cuda::MeanReduce(d_out.data(), d_v.data(), n, nullptr));
    EXPECT_TRUE(test::BitwiseEqual(d_out.Download(), got));
  }
}

}  // namespace
}  // namespace forge
