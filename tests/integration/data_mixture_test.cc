// Data mixtures end to end, with real processes: two small datasets mixed 0.6 / 0.4 (the
// second so small that it goes through several epochs).
//   - `forge train` on 4 MPI ranks stops at step 3, 2 ranks resume: the metrics and the final
//     weights are bitwise those of one uninterrupted process (which trains through the
//     in-process coordinator, so its plan came from a coordinator), and every checkpoint
//     records the same per-source consumption;
//   - under forge-coordinator: 2 worker ranks stop, 1 worker resumes (the plan the coordinator
//     hands out), the final weights equal the uninterrupted run's, and `forgectl data RUN`
//     (plain and --json) reports the sequences, tokens and epochs consumed per source that the
//     steps trained imply.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "control_plane_harness.h"
#include "counting_dataset.h"
#include "mpi_launch.h"
#include "train_records.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/mixture.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using test::Bin;
using test::CheckpointWeights;
using test::Contains;
using test::Forge;
using test::Mpirun;
using test::Records;
using test::Shell;
using test::ShellResult;

constexpr int64_t kSeqLen = 16, kGlobal = 8;
// Source b: 200 tokens = 12 sequences of 17, so 0.4 of 48 sequences is over 1.5 epochs.
constexpr int64_t kBSequences = (200 - 1) / kSeqLen;

std::string TempDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/forge_mix_" + std::to_string(::getpid()) + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void WriteSources(const std::string& dir) {
  test::WriteCountingDataset(dir + "/a", 777u, 40000, 4000);
  test::WriteCountingDataset(dir + "/b", 4242u, 200, 400);
}

std::string Spec(const std::string& dir, const std::string& name, int steps, int every,
                 int workers) {
  const std::string path = dir + "/" + name + ".yaml";
  std::ofstream(path) << "name: " << name << "\nseed: 9\n"
                      << "model: {n_layer: 2, d_model: 32, n_head: 4, n_kv_head: 2, ffn: 64, "
                         "vocab: 256, seq_len: "
                      << kSeqLen << "}\n"
                      << "data:\n  sources:\n"
                      << "    - {dir: " << dir << "/a, weight: 0.6}\n"
                      << "    - {dir: " << dir << "/b, weight: 0.4}\n"
                      << "schedule: {total_steps: " << steps << ", warmup_steps: 2}\n"
                      << "batch: {micro_batch: 2, global_batch: " << kGlobal << "}\n"
                      << "parallel: {mode: zero1, collective_timeout_s: 60}\n"
                      << "checkpoint: {every_steps: " << every << ", keep_last: 5}\n"
                      << "eval: {every_steps: 3, batches: 2}\n"
                      << "train: {backend: cpu, log_every: 1, workers: " << workers
                      << ", max_restarts: 1}\n";
  return path;
}

// Sequences each source has given after `steps` steps, by the mixture's own arithmetic.
std::vector<int64_t> Expected(int64_t steps) {
  auto m = MixtureSchedule::Make({0.6, 0.4}, 9);
  EXPECT_TRUE(m.ok());
  return m->CountsBefore(steps * kGlobal);
}

void ExpectRecord(const std::string& step_dir, int64_t steps) {
  auto m = ReadManifest(step_dir);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(m->data.has_value()) << step_dir << " has no data record";
  const DataUsage& d = *m->data;
  EXPECT_EQ(d.cursor, steps * kGlobal);
  ASSERT_EQ(d.sources.size(), 2u);
  const std::vector<int64_t> want = Expected(steps);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(d.sources[s].sequences, want[s]) << step_dir << " source " << s;
    EXPECT_EQ(d.sources[s].tokens, want[s] * kSeqLen);
  }
  EXPECT_EQ(d.sources[1].epoch_sequences, kBSequences);
  EXPECT_EQ(d.sources[1].epoch, want[1] / kBSequences);
  // The shares: 0.6 / 0.4 of the sequences, within one.
  EXPECT_NEAR(double(want[0]), 0.6 * double(steps * kGlobal), 1.5);
}

TEST(DataMixture, TwoSourcesResumeOnAnotherWorldSizeBitwise) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir("mpi");
  WriteSources(dir);
  const std::string spec = Spec(dir, "mix", 6, 2, 1);

  ShellResult ref = Shell(Forge("train " + spec + " --run-dir " + dir + "/ref"));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  EXPECT_TRUE(Contains(ref.output, "2 data sources")) << ref.output;
  ShellResult first =
      Shell(Mpirun(4) + Bin("forge") + " train " + spec + " --steps 3 --run-dir " + dir + "/run");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(Contains(first.output, "checkpoint step_3:")) << first.output;
  ShellResult second = Shell(Mpirun(2) + Bin("forge") + " train " + spec +
                             " --resume latest --run-dir " + dir + "/run");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  std::printf("[ reference %.1f s, 4 ranks to step 3 %.1f s, 2 ranks on %.1f s ]\n%s",
              ref.seconds, first.seconds, second.seconds, second.output.c_str());
  EXPECT_TRUE(Contains(second.output, "saved by 4 ranks")) << second.output;

  const auto want = Records(dir + "/ref/metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(Records(dir + "/run/metrics.jsonl"), want);
  const std::vector<float> w_ref = CheckpointWeights(dir + "/ref/checkpoints/step_6");
  const std::vector<float> w_run = CheckpointWeights(dir + "/run/checkpoints/step_6");
  ASSERT_FALSE(w_ref.empty());
  ASSERT_EQ(w_ref.size(), w_run.size());
  EXPECT_EQ(0, std::memcmp(w_ref.data(), w_run.data(), w_ref.size() * sizeof(float)))
      << "final weights differ";
  for (int64_t step : {4, 6}) {
    ExpectRecord(dir + "/ref/checkpoints/step_" + std::to_string(step), step);
    ExpectRecord(dir + "/run/checkpoints/step_" + std::to_string(step), step);
  }
  fs::remove_all(dir);
}

// `forgectl --json data RUN`: a source's field (a crude scan of the n-th source object).
int64_t SourceField(const std::string& json, int source, const std::string& key) {
  size_t at = json.find("\"sources\"");
  for (int i = 0; i <= source && at != std::string::npos; ++i) at = json.find("{", at + 1);
  if (at == std::string::npos) return -1;
  const size_t k = json.find("\"" + key + "\":", at);
  if (k == std::string::npos) return -1;
  size_t b = k + key.size() + 3;
  if (json[b] == '"') ++b;  // proto3 JSON writes int64 as a string
  return std::atoll(json.c_str() + b);
}

TEST(DataMixture, CoordinatorSchedulesThePlanAndForgectlReportsConsumption) {
  REQUIRE_MPIRUN();
  test::ControlPlane cp("mix");
  WriteSources(cp.dir());
  const std::string spec = Spec(cp.dir(), "cpmix", 12, 4, 2);
  ShellResult ref = Shell(Forge("train " + spec + " --run-dir " + cp.dir() + "/ref"));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;

  cp.StartCoordinator();
  cp.StartWorkers(2, /*throttle_ms=*/100);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = test::ControlPlane::RunId(sub);
  ASSERT_FALSE(run.empty()) << sub.output;
  ShellResult before = cp.Ctl("data " + run);
  EXPECT_EQ(before.exit_code, 0) << before.output;
  EXPECT_TRUE(Contains(before.output, "at the start of the run")) << before.output;
  ASSERT_TRUE(test::WaitFor(60, [&] { return cp.Step(run) >= 3; }))
      << cp.Ctl("status " + run).output << test::ReadFile(cp.dir() + "/workers.0.log");
  ASSERT_EQ(cp.Ctl("stop " + run).exit_code, 0);
  ASSERT_EQ(cp.Ctl("watch " + run).exit_code, 0);
  ASSERT_EQ(cp.StatusField(run, "state"), "STOPPED");
  const int64_t stopped = cp.Step(run);

  ShellResult mid = cp.Ctl("--json data " + run);
  ASSERT_EQ(mid.exit_code, 0) << mid.output;
  EXPECT_TRUE(Contains(mid.output, "\"step\":\"" + std::to_string(stopped) + "\""))
      << mid.output;  // the stop's checkpoint
  const std::vector<int64_t> at_stop = Expected(stopped);
  EXPECT_EQ(SourceField(mid.output, 0, "sequences"), at_stop[0]) << mid.output;
  EXPECT_EQ(SourceField(mid.output, 1, "sequences"), at_stop[1]) << mid.output;

  // One worker alone resumes: the coordinator hands it the plan of the stop's checkpoint.
  test::Process solo = test::Spawn(test::Bin("forge-worker") + " --coordinator " + cp.address() +
                                       " --join-secret-file " + cp.dir() + "/secret",
                                   cp.dir() + "/solo.log");
  ASSERT_EQ(cp.Ctl("resume " + run + " --workers 1").exit_code, 0);
  ShellResult done = cp.Ctl("watch " + run);
  solo.Kill();
  ASSERT_EQ(done.exit_code, 0) << done.output << test::ReadFile(cp.dir() + "/solo.log");
  EXPECT_EQ(cp.StatusField(run, "state"), "COMPLETED");

  const std::vector<int64_t> want = Expected(12);
  ShellResult js = cp.Ctl("--json data " + run);
  ASSERT_EQ(js.exit_code, 0) << js.output;
  std::printf("%s\n", js.output.c_str());
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(SourceField(js.output, s, "sequences"), want[size_t(s)]) << js.output;
    EXPECT_EQ(SourceField(js.output, s, "tokens"), want[size_t(s)] * kSeqLen) << js.output;
  }
  EXPECT_EQ(SourceField(js.output, 1, "epoch"), want[1] / kBSequences) << js.output;
  EXPECT_EQ(SourceField(js.output, 1, "epoch_sequences"), kBSequences) << js.output;
  EXPECT_TRUE(Contains(js.output, "\"step\":\"12\"")) << js.output;
  EXPECT_EQ(want[0] + want[1], 12 * kGlobal);

  ShellResult table = cp.Ctl("data " + run);
  ASSERT_EQ(table.exit_code, 0) << table.output;
  std::printf("%s", table.output.c_str());
  EXPECT_TRUE(Contains(table.output, "data at checkpoint step_12, 96 sequences consumed"))
      << table.output;
  EXPECT_TRUE(Contains(table.output, std::to_string(want[1] * kSeqLen))) << table.output;
  EXPECT_TRUE(Contains(table.output, cp.dir() + "/b")) << table.output;

  // The stream across the stop and the change of world size is the uninterrupted one.
  const std::vector<float> w_ref = CheckpointWeights(cp.dir() + "/ref/checkpoints/step_12");
  const std::vector<float> w_run =
      CheckpointWeights(cp.StatusField(run, "run_dir") + "/checkpoints/step_12");
  ASSERT_FALSE(w_ref.empty());
  ASSERT_EQ(w_ref.size(), w_run.size());
  EXPECT_EQ(0, std::memcmp(w_ref.data(), w_run.data(), w_ref.size() * sizeof(float)))
      << "final weights differ from the uninterrupted run";
}

}  // namespace
}  // namespace forge
