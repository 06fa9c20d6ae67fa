// The CPU backend's parallel modes in one process (world 1, no MPI): every mode must train
// exactly like ddp, gradient accumulation must follow the canonical order (what makes
// multi-rank runs bitwise equal to one process; tests/integration/parallel_mpi_test.cc runs
// those), and fsdp's evaluation contract (BeginEval gathers) must hold.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../common/tiny_fixtures.h"
#include "worker/model/init.h"
#include "worker/parallel/sum_order.h"
#include "worker/train/backend.h"

namespace forge {
namespace {

// knobs: head_dim 12 (attention width 48 over d_model 32), an untied LM head (a second tensor in
// the embedding unit, sharded with it) and Llama 3.1 RoPE scaling.
RunConfig Tiny(ParallelMode mode, bool knobs = false) {
  RunConfig c;
  c.seed = 11;
  c.model = test::TinyCpuModel(8);
  c.batch.micro_batch = 2;
  c.batch.global_batch = 8;
  c.optimizer.grad_clip = 0.5f;
  c.parallel.mode = mode;
  if (knobs) {
    c.model.explicit_head_dim = 12;
    c.model.tie_embeddings = false;
    c.model.rope_scaling.type = RopeScalingType::kLlama3;
    c.model.rope_scaling.original_max_position_embeddings = 4;
  }
  return c;
}

struct Batches {
  std::vector<std::vector<int32_t>> in, tgt;
  std::vector<MicroBatch> micro;
  Batches(const RunConfig& c, int count, int salt) {
    const int n = c.batch.micro_batch * c.model.seq_len;
    in.assign(count, std::vector<int32_t>(n));
    tgt.assign(count, std::vector<int32_t>(n));
    for (int k = 0; k < count; ++k)
      for (int i = 0; i < n; ++i) {
        in[k][i] = (k * 131 + i * 17 + salt * 7) % c.model.vocab;
        tgt[k][i] = (k * 29 + i * 5 + salt * 3 + 1) % c.model.vocab;
      }
    for (int k = 0; k < count; ++k) micro.push_back({in[k].data(), tgt[k].data()});
  }
};

std::unique_ptr<TrainBackend> Backend(const RunConfig& c) {
  auto b = MakeCpuBackend(c);
  const ParamLayout layout = MakeParamLayout(c.model);
  UnitBuffers p;
  InitParams(c.model, layout, c.seed, &p);
  EXPECT_TRUE(b->SetParams(p).ok());
  return b;
}

bool SameBits(const UnitBuffers& a, const UnitBuffers& b) {
  if (a.size() != b.size()) return false;
  for (size_t u = 0; u < a.size(); ++u)
    if (a[u].size() != b[u].size() ||
        std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)) != 0)
      return false;
  return true;
}

void ExpectEveryModeTrainsLikeDdp(bool knobs) {
  UnitBuffers ref_p, ref_m, ref_v;
  std::vector<float> ref_losses;
  for (ParallelMode mode :
       {ParallelMode::kDdp, ParallelMode::kZero1, ParallelMode::kZero2, ParallelMode::kFsdp}) {
    const RunConfig c = Tiny(mode, knobs);
    auto b = Backend(c);
    std::vector<float> losses;
    for (int step = 1; step <= 3; ++step) {
      Batches data(c, 4, step);
      StepStats st;
      ASSERT_TRUE(b->TrainStep(data.micro, {1e-2f, step}, true, &st).ok())
          << ParallelModeName(mode);
      ASSERT_TRUE(st.valid);
      losses.push_back(st.loss);
      losses.push_back(st.grad_norm);
    }
    UnitBuffers p, m, v;
    ASSERT_TRUE(b->GetParams(&p).ok());
    ASSERT_TRUE(b->GetMoments(&m, &v).ok());
    if (mode == ParallelMode::kDdp) {
      ref_p = p, ref_m = m, ref_v = v, ref_losses = losses;
      continue;
    }
    EXPECT_EQ(std::memcmp(losses.data(), ref_losses.data(), losses.size() * 4), 0)
        << ParallelModeName(mode);
    EXPECT_TRUE(SameBits(p, ref_p)) << ParallelModeName(mode);
    EXPECT_TRUE(SameBits(m, ref_m)) << ParallelModeName(mode);
    EXPECT_TRUE(SameBits(v, ref_v)) << ParallelModeName(mode);
  }
}

TEST(CpuBackendParallel, EveryModeTrainsLikeDdpInOneProcess) { ExpectEveryModeTrainsLikeDdp(false); }

TEST(CpuBackendParallel, EveryModeTrainsLikeDdpWithTheLlamaKnobs) {
  ExpectEveryModeTrainsLikeDdp(true);
}

TEST(CpuBackendParallel, AccumulationFollowsTheCanonicalOrder) {
  // With 4 micro-steps (a power of two, so scaling by 1/4 is exact), the step gradient must be
  // CanonicalSum of the per-micro-batch gradients times 1/4, bit for bit.
  const RunConfig c = Tiny(ParallelMode::kDdp);
  auto b = Backend(c);
  Batches data(c, 4, 1);
  UnitBuffers all;
  float loss = 0;
  ASSERT_TRUE(b->ComputeGradients(data.micro, &all, &loss).ok());
  std::vector<UnitBuffers> each(4);
  for (int k = 0; k < 4; ++k) {
    float l = 0;
    ASSERT_TRUE(b->ComputeGradients({data.micro[k]}, &each[k], &l).ok());
  }
  int sequential_differs = 0;
  for (size_t u = 0; u < all.size(); ++u) {
    const int64_t n = int64_t(all[u].size());
    std::vector<float*> parts(4);
    for (int k = 0; k < 4; ++k) {
      for (float& x : each[k][u]) x *= 0.25f;
      parts[k] = each[k][u].data();
    }
    std::vector<float> seq(n, 0.0f);  // plain left-to-right accumulation, for contrast
    for (int k = 0; k < 4; ++k)
      for (int64_t i = 0; i < n; ++i) seq[i] += parts[k][i];
    std::vector<float> want(n);
    CanonicalSum(want.data(), parts.data(), 4, n);
    EXPECT_EQ(std::memcmp(want.data(), all[u].data(), n * 4), 0) << "unit " << u;
    sequential_differs += std::memcmp(seq.data(), all[u].data(), n * 4) != 0;
  }
  EXPECT_GT(sequential_differs, 0) << "the order should be observable on this data";
}

TEST(CpuBackendParallel, FsdpEvaluatesAfterBeginEval) {
  const RunConfig c = Tiny(ParallelMode::kFsdp);
  auto fsdp = Backend(c);
  auto ddp = Backend(Tiny(ParallelMode::kDdp));
  Batches data(c, 4, 2);
  ASSERT_TRUE(fsdp->TrainStep(data.micro, {1e-2f, 1}, false, nullptr).ok());
  ASSERT_TRUE(ddp->TrainStep(data.micro, {1e-2f, 1}, false, nullptr).ok());
  float a = 0, b = 0;
  // After a step fsdp holds only its shard: evaluating needs the gather first.
  Status early = fsdp->EvalLoss(data.micro[0], &a);
  EXPECT_EQ(early.code(), Code::kFailedPrecondition) << early.ToString();
  ASSERT_TRUE(fsdp->BeginEval().ok());
  ASSERT_TRUE(fsdp->EvalLoss(data.micro[0], &a).ok());
  ASSERT_TRUE(ddp->BeginEval().ok());
  ASSERT_TRUE(ddp->EvalLoss(data.micro[0], &b).ok());
  EXPECT_EQ(a, b);
}

TEST(CpuBackendParallel, ShardedMomentsRoundTrip) {
  const RunConfig c = Tiny(ParallelMode::kZero2);
  auto b = Backend(c);
  Batches data(c, 4, 3);
  ASSERT_TRUE(b->TrainStep(data.micro, {1e-2f, 1}, false, nullptr).ok());
  UnitBuffers m, v, m2, v2;
  ASSERT_TRUE(b->GetMoments(&m, &v).ok());
  auto other = Backend(c);
  ASSERT_TRUE(other->SetMoments(m, v).ok());
  ASSERT_TRUE(other->GetMoments(&m2, &v2).ok());
  EXPECT_TRUE(SameBits(m, m2));
  EXPECT_TRUE(SameBits(v, v2));
  UnitBuffers wrong = m;
  wrong[0].pop_back();
  EXPECT_FALSE(other->SetMoments(wrong, v).ok());
}

}  // namespace
}  // namespace forge
