// `forge train` refusing what it cannot do, as a user would meet it (the real binary):
//   - a directory given as the config is named as one (it reads as an empty file);
//   - model sizes that fit an int but no memory (n_layer 100000, d_model 10^9, seq_len 2*10^9)
//     are refused before anything is allocated, naming the key, instead of dying in
//     std::bad_alloc or the OOM killer, directly and through the local coordinator alike.
// (A shape the cuda backend's kernels cannot take is refused by CudaModel naming the key:
// tests/gpu/cuda_model_test.cc, GpuModel.RejectsBadInput.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "counting_dataset.h"
#include "mpi_launch.h"

namespace forge {
namespace {

using test::Bin;
using test::Shell;
using test::ShellResult;

class ForgeTrainRefusals : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/forge_refusals_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    test::WriteCountingDataset(dir_ + "/data", 5u, 2000, 500);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A config with `model` as its model section; `forge train [--direct]` on it.
  ShellResult Train(const std::string& name, const std::string& model, bool direct) {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "name: " << name << "\n"
                        << "model: " << model << "\n"
                        << "data: {dataset_dir: " << dir_ << "/data}\n"
                        << "schedule: {total_steps: 4, warmup_steps: 1}\n"
                        << "batch: {micro_batch: 2, global_batch: 2}\n"
                        << "train: {backend: cpu, max_restarts: 0}\n";
    return Shell("OPENBLAS_NUM_THREADS=1 timeout 60 " + Bin("forge") + " train " +
                 (direct ? "--direct " : "") + path + " --run-dir " + dir_ + "/run_" + name);
  }

  std::string dir_;
};

TEST_F(ForgeTrainRefusals, ADirectoryIsNamedAsOne) {
  ShellResult r = Shell("timeout 60 " + Bin("forge") + " train " + dir_);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir_ + ": is a directory, not a config file"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("empty"), std::string::npos) << r.output;
}

TEST_F(ForgeTrainRefusals, ModelsTooLargeForMemoryNameTheKey) {
  const std::string base = "n_head: 4, ffn: 64, vocab: 256";
  const struct {
    const char* name;
    std::string model;
    const char* key;
  } cases[] = {
      {"layers", "{n_layer: 100000, d_model: 768, n_head: 12, ffn: 2048, vocab: 256, seq_len: 64}",
       "model.n_layer (100000)"},
      {"wide", "{n_layer: 2, d_model: 1000000000, " + base + ", seq_len: 16}",
       "model.d_model (1000000000)"},
      {"long", "{n_layer: 2, d_model: 32, " + base + ", seq_len: 2000000000}",
       "model.seq_len (2000000000)"},
  };
  for (const auto& c : cases) {
    for (bool direct : {true, false}) {
      ShellResult r = Train(c.name, c.model, direct);
      EXPECT_EQ(r.exit_code, 1) << c.name << (direct ? " direct: " : ": ") << r.output;
      EXPECT_NE(r.output.find("the model does not fit"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find(c.key), std::string::npos) << r.output;
      EXPECT_LT(r.seconds, 30.0) << c.name;
    }
  }
}

}  // namespace
}  // namespace forge
