// Exact resume on the CUDA backend through the trainer's own checkpoint path (RunTraining +
// trainer_checkpoint): a run resumed from its step-4 checkpoint by a fresh backend is bitwise
// the uninterrupted 8-step run (losses, grad norms, val losses, weights, AdamW moments, and
// the step-8 checkpoint it writes). Tiny model as in cuda_model_test (2 layers, d 128, 4 heads,
// ffn 256, vocab 500, T 64, B 4), global batch 8 = 2 micro-steps; the resumed backend's first
// step runs eagerly where the uninterrupted one replays its CUDA graph, which must not matter.
// Each precision also with Llama 3's knobs all on: 4 query heads of 64 over one KV head
// (attention wider than d_model), an untied LM head (its own weight and moments in the
// checkpoint), QK-norm and Llama 3.1's RoPE scaling.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/tiny_fixtures.h"
#include "gpu_test_util.h"
#include "tiny_gpu_config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

using test::SameBits;

namespace fs = std::filesystem;

struct ResumeCase {
  Precision precision;
  bool llama_knobs;
};

RunConfig TinyConfig(const ResumeCase& k) {
  RunConfig c = test::TinyGpuConfig("gpu-resume-test");
  c.precision.compute = k.precision;
  if (k.llama_knobs) test::SetLlamaKnobs(&c.model, /*n_kv_head=*/1);  // GQA 4:1
  c.precision.fp8.amax_history = 3;  // shorter than the run, so the window wraps
  c.batch.global_batch = 8;  // two micro-steps per optimizer step
  c.schedule.total_steps = 8;
  c.schedule.warmup_steps = 2;
  c.eval.every_steps = 3;
  c.eval.batches = 2;
  c.train.log_every = 1;
  c.train.backend = Backend::kCuda;
  c.checkpoint.every_steps = 4;
  return c;
}

// Sequence s of the token stream: pseudo-random tokens from a hash of s (in memory, so the
// data cursor alone decides what a step sees).
BatchProvider Data(const RunConfig& c) { return test::HashedTokenData(c, 977u, 1000000); }

using test::RunOutcome;

RunOutcome Train(const RunConfig& c) {
  auto made = MakeCudaTrainBackend(c, CudaBackendOptions{});
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  if (!made.ok()) return {};
  std::unique_ptr<CudaTrainBackend> backend = std::move(made).value();
  RunOutcome run = test::TrainKeepingState(c, backend.get(), Data(c));
  std::printf("[ %ld steps, CUDA graph %s at the end ]\n", long(run.result.steps),
              backend->graph_active() ? "active" : "inactive");
  return run;
}

void ExpectSameBuffers(const UnitBuffers& got, const UnitBuffers& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t u = 0; u < got.size(); ++u)
    EXPECT_TRUE(test::BitwiseEqual(got[u], want[u])) << what << " of unit " << u;
}

std::string TempDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/forge_gpu_resume_" +
                          std::to_string(::getpid()) + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// BF16 and FP8 (whose scaling histories travel in the checkpoint's "fp8" blob).
class GpuTrainerResume : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(GpuTrainerResume, ResumedRunIsBitwiseTheUninterruptedOne) {
  FORGE_SKIP_WITHOUT_GPU();
  const std::string dir = TempDir(std::string("run_") + PrecisionName(GetParam().precision) +
                                  (GetParam().llama_knobs ? "_llama" : ""));

  RunConfig c = TinyConfig(GetParam());
  c.checkpoint.dir = dir + "/reference";
  const RunOutcome ref = Train(c);
  ASSERT_EQ(ref.result.steps, 8);
  ASSERT_EQ(ref.result.checkpoints, (std::vector<int64_t>{4, 8}));
  ASSERT_EQ(ref.records.size(), 8u);
  EXPECT_LT(ref.records.back().loss, ref.records.front().loss) << "the run did not learn";

  // A fresh backend (weights from cfg.seed, zero moments) resumes from the reference's step_4
  // and writes its own checkpoints elsewhere.
  RunConfig r = TinyConfig(GetParam());
  r.checkpoint.dir = dir + "/resumed";
  r.checkpoint.resume = c.checkpoint.dir + "/step_4";
  const RunOutcome res = Train(r);
  EXPECT_EQ(res.result.resumed_step, 4);
  EXPECT_EQ(res.result.steps, 8);
  EXPECT_EQ(res.result.checkpoints, (std::vector<int64_t>{8}));
  ASSERT_EQ(res.records.size(), 4u);
  for (size_t i = 0; i < res.records.size(); ++i) {
    const StepRecord& got = res.records[i];
    const StepRecord& want = ref.records[4 + i];
    SCOPED_TRACE("step " + std::to_string(got.step));
    EXPECT_EQ(got.step, want.step);
    EXPECT_TRUE(SameBits(got.loss, want.loss)) << got.loss << " vs " << want.loss;
    EXPECT_TRUE(SameBits(got.grad_norm, want.grad_norm)) << got.grad_norm << " vs "
                                                         << want.grad_norm;
    EXPECT_TRUE(SameBits(got.lr, want.lr));
    EXPECT_TRUE(SameBits(got.val_loss, want.val_loss)) << got.val_loss << " vs "
                                                       << want.val_loss;
  }
  EXPECT_TRUE(SameBits(res.result.final_val_loss, ref.result.final_val_loss));
  ExpectSameBuffers(res.w, ref.w, "weights");
  ExpectSameBuffers(res.m, ref.m, "first moment");
  ExpectSameBuffers(res.v, ref.v, "second moment");

  // The step-8 checkpoints of both runs hold the same state and data cursor.
  const ParamLayout layout = MakeParamLayout(c.model);
  auto x = LoadFullCheckpoint(r.checkpoint.dir + "/step_8", &layout);
  auto y = LoadFullCheckpoint(c.checkpoint.dir + "/step_8", &layout);
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  ExpectSameBuffers(x->master, y->master, "step_8 master weights");
  ExpectSameBuffers(x->m, y->m, "step_8 first moment");
  ExpectSameBuffers(x->v, y->v, "step_8 second moment");
  EXPECT_EQ(x->trainer.data_cursor, 8 * c.batch.global_batch);
  EXPECT_EQ(x->trainer.data_cursor, y->trainer.data_cursor);
  // And the checkpoint holds what the backend had: a save is a bitwise copy.
  ExpectSameBuffers(y->master, ref.w, "step_8 vs the backend's weights");
  EXPECT_EQ(x->trainer.extra.count("fp8"), GetParam().precision == Precision::kFp8 ? 1u : 0u);
  EXPECT_TRUE(x->trainer.extra == y->trainer.extra) << "backend state blobs differ";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Precisions, GpuTrainerResume,
                         ::testing::Values(ResumeCase{Precision::kBf16, false},
                                           ResumeCase{Precision::kFp8, false},
                                           ResumeCase{Precision::kBf16, true},
                                           ResumeCase{Precision::kFp8, true}),
                         [](const auto& info) {
                           return std::string(PrecisionName(info.param.precision)) +
                                  (info.param.llama_knobs ? "_llama" : "");
                         });

}  // namespace
}  // namespace forge
