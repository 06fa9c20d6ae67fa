// `forge eval`: a checkpoint's validation loss on the CPU backend, evaluated exactly as the
// trainer evaluates (same batches, same order, same mean), and the token dump that lets
// scripts/check_export_torch.py evaluate the identical batches in PyTorch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "counting_dataset.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/data/shard.h"
#include "worker/train/trainer.h"
#include "mpi_launch.h"
#include "../common/run_command.h"

namespace forge {
namespace {

using test::CommandResult;
namespace fs = std::filesystem;

// Standard error apart, in the test's folder.
CommandResult Shell(const std::string& cmd, const std::string& dir) {
  return test::RunCommand(cmd, dir + "/stderr.txt");
}

// The CPU backend throughout: these tests compare with the CPU trainer bit for bit (the default
// would pick the GPU where there is one).
std::string Forge(const std::string& args) {
  return "OPENBLAS_NUM_THREADS=1 timeout 120 " + test::Bin("forge") + " " +
         args + " --backend cpu";
}

std::string TempDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/forge_eval_test_" + std::to_string(::getpid()) + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Train 30000 / val 3000 tokens over a 256-token vocabulary, mostly "previous + 1".
void WriteDataset(const std::string& dir) {
  test::WriteCountingDataset(dir, 4242u, 30000, 3000);
}

RunConfig SmallConfig(const std::string& dir) {
  RunConfig c;
  c.name = "eval-test";
  c.seed = 5;
  c.model.preset = "";
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.n_head = 4;
  c.model.n_kv_head = 4;
  c.model.ffn = 64;
  c.model.vocab = 256;
  c.model.seq_len = 16;
  c.data.dataset_dir = dir + "/data";
  c.batch.micro_batch = 2;
  c.batch.global_batch = 4;
  c.schedule.total_steps = 4;
  c.schedule.warmup_steps = 1;
  c.optimizer.lr = 1e-2f;
  c.eval.every_steps = 0;  // only the final evaluation
  c.eval.batches = 3;
  c.checkpoint.every_steps = 4;
  c.train.backend = Backend::kCpu;
  c.train.run_dir = dir + "/run";
  return c;
}

// The CLI's data wiring (forge_main.cc Train) over an opened dataset.
BatchProvider DatasetBatches(const RunConfig& c, const TokenDataset& ds, const SamplingPlan& plan) {
  BatchProvider p;
  p.train = [&c, &ds, &plan](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    return FillTrainBatch(ds.split(Split::kTrain), plan, cursor, 0, 1, c.batch.micro_batch, k,
                          in, tgt);
  };
  p.val = [&c, &ds](int64_t i, int32_t* in, int32_t* tgt) {
    return FillEvalBatch(ds.split(Split::kVal), c.model.seq_len, i, c.batch.micro_batch, in,
                         tgt);
  };
  return p;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

class ForgeEval : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir("suite"));
    WriteDataset(*dir_ + "/data");
    cfg_ = new RunConfig(SmallConfig(*dir_));
    auto ds = TokenDataset::Open(cfg_->data.dataset_dir);
    ASSERT_TRUE(ds.ok()) << ds.status().ToString();
    const SamplingPlan plan(ds->split(Split::kTrain).size(), cfg_->model.seq_len, cfg_->seed,
                            true);
    auto backend = MakeCpuBackend(*cfg_);
    TrainOptions opt;
    opt.print_progress = false;
    auto r = RunTraining(*cfg_, backend.get(), DatasetBatches(*cfg_, *ds, plan), opt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->checkpoints, std::vector<int64_t>{4});
    final_val_loss_ = r->final_val_loss;
  }
  static void TearDownTestSuite() {
    fs::remove_all(fs::path(*dir_).parent_path());
    delete dir_;
    delete cfg_;
  }
  static std::string* dir_;
  static RunConfig* cfg_;
  static float final_val_loss_;
};
std::string* ForgeEval::dir_ = nullptr;
RunConfig* ForgeEval::cfg_ = nullptr;
float ForgeEval::final_val_loss_ = 0.0f;

TEST_F(ForgeEval, LossOfTheFinalCheckpointIsTheTrainersFinalValLoss) {
  const CommandResult r =
      Shell(Forge("eval --checkpoint latest --run-dir " + *dir_ + "/run"), *dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::printf("%s", r.out.c_str());
  const float loss = j.at("loss").get<float>();
  EXPECT_TRUE(SameBits(loss, final_val_loss_)) << loss << " vs trainer " << final_val_loss_;
  EXPECT_EQ(j.at("step").get<int64_t>(), 4);
  EXPECT_EQ(j.at("batches").get<int>(), 3);  // the checkpoint config's eval.batches
  ASSERT_EQ(j.at("per_batch").size(), 3u);
  double sum = 0.0;
  for (const auto& l : j.at("per_batch")) sum += l.get<float>();
  EXPECT_TRUE(SameBits(float(sum / 3), loss));
  EXPECT_NE(j.at("per_batch")[0].get<float>(), j.at("per_batch")[1].get<float>());
}

TEST_F(ForgeEval, DumpHoldsTheExactBatchesItEvaluated) {
  const std::string dump = *dir_ + "/tokens.bin";
  const CommandResult all =
      Shell(Forge("eval --checkpoint " + cfg_->train.run_dir + "/checkpoints/step_4"), *dir_);
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const CommandResult two = Shell(Forge("eval --checkpoint step_4 --run-dir " + *dir_ +
                                      "/run --batches 2 --dump-tokens " + dump),
                                *dir_);
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const auto ja = nlohmann::json::parse(all.out), j2 = nlohmann::json::parse(two.out);
  ASSERT_EQ(j2.at("per_batch").size(), 2u);
  for (int i = 0; i < 2; ++i)  // batch i is the same batch whatever the count
    EXPECT_TRUE(SameBits(j2["per_batch"][i].get<float>(), ja["per_batch"][i].get<float>()));

  const int B = cfg_->batch.micro_batch, T = cfg_->model.seq_len;
  const size_t per = size_t(B) * T;
  std::ifstream in(dump, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 12 + 2 * 2 * per * 4);
  int32_t header[3];
  std::memcpy(header, bytes.data(), 12);
  EXPECT_EQ(header[0], 2);
  EXPECT_EQ(header[1], B);
  EXPECT_EQ(header[2], T);
  std::vector<int32_t> inputs(2 * per), targets(2 * per);
  std::memcpy(inputs.data(), bytes.data() + 12, inputs.size() * 4);
  std::memcpy(targets.data(), bytes.data() + 12 + inputs.size() * 4, targets.size() * 4);

  auto ds = TokenDataset::Open(cfg_->data.dataset_dir);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  std::vector<int32_t> want_in(per), want_tgt(per);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(FillEvalBatch(ds->split(Split::kVal), T, i, B, want_in.data(), want_tgt.data())
                    .ok());
    EXPECT_TRUE(std::equal(want_in.begin(), want_in.end(), inputs.begin() + i * per))
        << "inputs of batch " << i;
    EXPECT_TRUE(std::equal(want_tgt.begin(), want_tgt.end(), targets.begin() + i * per))
        << "targets of batch " << i;
  }

  // Re-evaluating the dumped batches in process gives the reported per-batch losses.
  auto ck = LoadFullCheckpoint(cfg_->train.run_dir + "/checkpoints/step_4");
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  auto backend = MakeCpuBackend(*cfg_);
  ASSERT_TRUE(backend->SetParams(ck->master).ok());
  for (int i = 0; i < 2; ++i) {
    float l = 0.0f;
    ASSERT_TRUE(backend->EvalLoss({inputs.data() + i * per, targets.data() + i * per}, &l).ok());
    EXPECT_TRUE(SameBits(l, j2["per_batch"][i].get<float>())) << "batch " << i;
  }
}

TEST_F(ForgeEval, RefusesAConfigOfAnotherModelAndAMissingCheckpoint) {
  RunConfig other = *cfg_;
  other.model.d_model = 64;
  const std::string path = *dir_ + "/other.yaml";
  { std::ofstream(path) << RunConfigToYaml(other); }
  const CommandResult r = Shell(Forge("eval --checkpoint latest --run-dir " + *dir_ +
                                    "/run --config " + path),
                              *dir_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("does not match checkpoint"), std::string::npos) << r.err;

  const CommandResult none =
      Shell(Forge("eval --checkpoint latest --run-dir " + *dir_ + "/nothing"), *dir_);
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("no checkpoint"), std::string::npos) << none.err;

  const CommandResult zero = Shell(Forge("eval --checkpoint latest --run-dir " + *dir_ +
                                       "/run --batches 0"),
                                 *dir_);
  EXPECT_NE(zero.exit_code, 0);
  EXPECT_NE(zero.err.find("--batches"), std::string::npos) << zero.err;
}

}  // namespace
}  // namespace forge
