// Programmatic dependent launch (kernels/cuda/launch.cuh) changes when a grid is dispatched,
// never what it computes: a model trained with every one of our kernels launched with PDL must
// end bit for bit where the same training with ordinary launches ends. A kernel that touched
// memory before its PdlWaitPrior() would read its predecessor's half-written output and break
// this (or the run-to-run determinism the other tests check).
//
// The model is larger than the tiny config so that the kernels run many waves (2,048 tokens,
// d 256 in heads of 64: the RoPE-epilogue GEMM on sm_90), with graph replay as in training,
// in BF16 and in FP8 with the FP8 LM head.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "model_test_util.h"
#include "no_gemm_autotune.h"
#include "tiny_gpu_config.h"
#include "kernels/cuda/launch.cuh"
#include "worker/train/cuda_backend.h"

namespace forge {
namespace {

using test::MakeBatches;
using test::MakeGpu;
using test::Views;

// Restores the process-wide setting whatever the test does.
class PdlSetting {
 public:
  PdlSetting() : saved_(cuda::PdlEnabled()) {}
  ~PdlSetting() { cuda::SetPdlEnabled(saved_); }

 private:
  bool saved_;
};

RunConfig MidConfig(Precision p) {
  RunConfig c = test::TinyGpuConfig("gpu-pdl-test");
  c.model.d_model = 256;
  c.model.n_head = c.model.n_kv_head = 4;
  c.model.ffn = 768;
  c.model.seq_len = 256;
  c.batch.micro_batch = c.batch.global_batch = 8;
  c.precision.compute = p;
  if (p == Precision::kFp8) c.precision.fp8.lm_head = true;
  return c;
}

struct Trained {
  UnitBuffers params;
  float loss = 0.0f;
};

Trained Train(const RunConfig& c, bool pdl, int steps) {
  cuda::SetPdlEnabled(pdl);
  CudaBackendOptions o;
  o.use_graph = true;
  auto gpu = MakeGpu(c, o);
  Trained t;
  if (gpu == nullptr) return t;
  const auto batches = MakeBatches(c, steps, 53);
  for (int step = 1; step <= steps; ++step) {
    StepStats s;
    const Status st =
        gpu->TrainStep(Views(batches, step - 1, 1), {c.optimizer.lr, step}, step == steps, &s);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return t;
    if (step == steps) t.loss = s.loss;
  }
  EXPECT_TRUE(gpu->graph_active());
  const Status got = gpu->GetParams(&t.params);
  EXPECT_TRUE(got.ok()) << got.ToString();
  return t;
}

class ProgrammaticLaunch : public ::testing::TestWithParam<Precision> {};

TEST_P(ProgrammaticLaunch, TrainingMatchesOrdinaryLaunchBitwise) {
  FORGE_SKIP_WITHOUT_GPU();
  const PdlSetting restore;
  const test::NoGemmAutotune fixed_gemms;
  const RunConfig c = MidConfig(GetParam());
  constexpr int kSteps = 8;
  const Trained with = Train(c, /*pdl=*/true, kSteps);
  const Trained without = Train(c, /*pdl=*/false, kSteps);
  ASSERT_FALSE(with.params.empty());
  ASSERT_EQ(with.params.size(), without.params.size());
  EXPECT_EQ(with.loss, without.loss);
  EXPECT_GT(with.loss, 0.0f);
  for (size_t u = 0; u < with.params.size(); ++u) {
    EXPECT_TRUE(test::BitwiseEqual(with.params[u], without.params[u])) << "weights of unit " << u;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, ProgrammaticLaunch,
                         ::testing::Values(Precision::kBf16, Precision::kFp8),
                         [](const auto& info) {
                           return std::string(info.param == Precision::kFp8 ? "fp8" : "bf16");
                         });

}  // namespace
}  // namespace forge
