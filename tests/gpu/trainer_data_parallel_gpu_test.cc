// Sharded checkpoints of data-parallel GPU runs through the trainer's own path (RunTraining +
// trainer_checkpoint) on 2 ranks, one thread each, in ddp, zero2 and fsdp, and in ddp and fsdp
// with Llama 3's knobs (tiny_gpu_config.h):
//   - a run resumed from its step-4 checkpoint by fresh backends is bitwise the uninterrupted
//     8-step run (losses, grad norms, val losses, weights, AdamW moments);
//   - the same checkpoint resumed on ONE GPU (resharding 2 -> 1, same global batch and data
//     cursor) continues the trajectory within BF16-run tolerances (loss 1e-2 relative, final
//     weights 1e-2 relative Frobenius per unit).
// Tiny model (tiny_gpu_config.h), global batch 16 = 2 micro-steps of 4 per rank. With fewer
// than 2 GPUs the ranks share one (RunRanksOnAnyGpus).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/tiny_fixtures.h"
#include "gpu_test_util.h"
#include "nccl_test_util.h"
#include "tiny_gpu_config.h"
#include "worker/parallel/host_staged_comm.h"
#include "worker/train/cuda_backend.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

using test::RelFrobenius;
using test::SameBits;

namespace fs = std::filesystem;
constexpr int kWorld = 2;

struct ResumeCase {
  ParallelMode mode;
  bool llama_knobs;
};

RunConfig Config(const ResumeCase& k, const std::string& dir) {
  RunConfig c = test::TinyGpuConfig("gpu-dp-resume-test");
  if (k.llama_knobs) test::SetLlamaKnobs(&c.model, /*n_kv_head=*/2);
  c.batch.global_batch = 16;
  c.schedule.total_steps = 8;
  c.schedule.warmup_steps = 2;
  c.eval.every_steps = 4;
  c.eval.batches = 3;  // uneven over 2 ranks: fsdp's collective eval passes must still pair up
  c.train.log_every = 1;
  c.train.backend = Backend::kCuda;
  c.checkpoint.every_steps = 4;
  c.checkpoint.dir = dir;
  c.parallel.mode = k.mode;
  return c;
}

// This rank's slice of the in-memory token stream (the sampler's convention: rank r's micro-step
// k of the global batch at `cursor` is global micro-step k*W + r). The hashed stream is random
// (its loss floor is ln V), and with the Llama knobs' untied head the loss starts at that floor,
// where 8 steps cannot show the run learning: those runs read counting sequences.
BatchProvider RankData(const RunConfig& c, int rank, int world, bool counting) {
  BatchProvider all = counting ? test::CountingData(c, c.model.vocab, [](int64_t) { return false; })
                               : test::HashedTokenData(c, 977u, 1000000);
  BatchProvider mine;
  mine.train = [all, rank, world](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    return all.train(cursor, k * world + rank, in, tgt);
  };
  mine.val = all.val;
  return mine;
}

std::vector<test::RunOutcome> TrainOnRanks(const RunConfig& c, bool counting) {
  std::vector<test::RunOutcome> out(kWorld);
  Errors e;
  RunRanksOnAnyGpus(kWorld, NcclCommOptions{}, &e, [&](int r, NcclComm* comm) {
    auto backend = MakeCudaTrainBackend(c, CudaBackendOptions{}, comm);
    auto host = MakeHostStagedComm(comm);
    if (!backend.ok() || !host.ok()) {
      return e.Add(r, "setup: " + (!backend.ok() ? backend.status() : host.status()).ToString());
    }
    TrainOptions opt;
    opt.comm = host->get();
    out[r] = test::TrainKeepingState(c, backend->get(), RankData(c, r, kWorld, counting), opt);
  });
  for (const std::string& m : e.list) ADD_FAILURE() << m;
  return out;
}

class GpuDataParallelResume : public ::testing::TestWithParam<ResumeCase> {};

std::string CaseName(const ResumeCase& k) {
  return std::string(ParallelModeName(k.mode)) + (k.llama_knobs ? "_llama" : "");
}

TEST_P(GpuDataParallelResume, ResumesBitwiseAndReshardsToOneGpu) {
  FORGE_SKIP_WITHOUT_GPU();
  const std::string dir = ::testing::TempDir() + "/forge_gpu_dp_resume_" +
                          std::to_string(::getpid()) + "/" + CaseName(GetParam());
  fs::remove_all(dir);

  const RunConfig ref_cfg = Config(GetParam(), dir + "/reference");
  const auto ref = TrainOnRanks(ref_cfg, GetParam().llama_knobs);
  ASSERT_EQ(ref[0].result.steps, 8);
  ASSERT_EQ(ref[0].result.checkpoints, (std::vector<int64_t>{4, 8}));
  ASSERT_EQ(ref[0].records.size(), 8u);
  EXPECT_LT(ref[0].records.back().loss, ref[0].records.front().loss) << "the run did not learn";

  RunConfig res_cfg = Config(GetParam(), dir + "/resumed");
  res_cfg.checkpoint.resume = ref_cfg.checkpoint.dir + "/step_4";
  const auto res = TrainOnRanks(res_cfg, GetParam().llama_knobs);
  ASSERT_EQ(res[0].records.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const StepRecord& got = res[0].records[i];
    const StepRecord& want = ref[0].records[4 + i];
    SCOPED_TRACE("step " + std::to_string(got.step));
    EXPECT_TRUE(SameBits(got.loss, want.loss)) << got.loss << " vs " << want.loss;
    EXPECT_TRUE(SameBits(got.grad_norm, want.grad_norm));
    EXPECT_TRUE(SameBits(got.val_loss, want.val_loss));
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(res[r].w == ref[r].w) << "rank " << r << ": weights differ after resuming";
    EXPECT_TRUE(res[r].m == ref[r].m && res[r].v == ref[r].v) << "rank " << r << ": moments";
  }

  // The same step-4 checkpoint on one GPU: same global batch (4 micro-steps), same cursor.
  RunConfig one_cfg = Config({ParallelMode::kDdp, GetParam().llama_knobs}, dir + "/one_gpu");
  one_cfg.checkpoint.resume = ref_cfg.checkpoint.dir + "/step_4";
  cudaSetDevice(0);
  auto one_backend = MakeCudaTrainBackend(one_cfg, CudaBackendOptions{});
  ASSERT_TRUE(one_backend.ok()) << one_backend.status().ToString();
  const test::RunOutcome one =
      test::TrainKeepingState(one_cfg, one_backend->get(), RankData(one_cfg, 0, 1, GetParam().llama_knobs));
  ASSERT_EQ(one.records.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(one.records[i].loss, ref[0].records[4 + i].loss,
                1e-2 * std::fabs(ref[0].records[4 + i].loss))
        << "step " << one.records[i].step;
  }
  ASSERT_EQ(one.w.size(), ref[0].w.size());
  for (size_t u = 0; u < one.w.size(); ++u)
    EXPECT_LT(RelFrobenius(one.w[u], ref[0].w[u]), 1e-2) << "unit " << u;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, GpuDataParallelResume,
                         ::testing::Values(ResumeCase{ParallelMode::kDdp, false},
                                           ResumeCase{ParallelMode::kZero2, false},
                                           ResumeCase{ParallelMode::kFsdp, false},
                                           ResumeCase{ParallelMode::kDdp, true},
                                           ResumeCase{ParallelMode::kFsdp, true}),
                         [](const ::testing::TestParamInfo<ResumeCase>& i) {
                           return CaseName(i.param);
                         });

}  // namespace
}  // namespace forge
