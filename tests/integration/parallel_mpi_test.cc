// Data parallelism across processes: launches forge_parallel_check (tests/integration/mpi/)
// and `forge train` under mpirun, oversubscribed (4 ranks fit on 2 cores: the models are tiny).
//
// What is bitwise and what is not (src/worker/parallel/sum_order.h, train/cpu_backend.cc):
//   - worlds 1, 2, 4 (powers of two), any micro-steps per rank, every mode: loss, grad norm,
//     val loss, weights and AdamW moments after K steps are bitwise those of one process with
//     the same global batch;
//   - any world with one micro-step per rank (world 3, global 3): bitwise too;
//   - world 3 with 2 micro-steps per rank: the canonical order cannot match one process, so
//     the result is within tolerance (losses 1e-6 relative, weights and moments 1e-4 of their
//     unit's largest magnitude; see the driver for the measured values and why).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "counting_dataset.h"
#include "mpi_launch.h"
#include "worker/data/dataset.h"
#include "worker/data/shard.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using test::Bin;
using test::Mpirun;
using test::Shell;
using test::ShellResult;

TEST(ParallelMpi, CommCollectivesOnTwoThreeAndFourRanks) {
  REQUIRE_MPIRUN();
  for (int ranks : {2, 3, 4}) {
    ShellResult r = Shell(Mpirun(ranks) + Bin("forge_parallel_check") + " comm");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("PARALLEL_CHECK OK"), std::string::npos) << r.output;
    std::printf("[ comm %d ranks ] %.1f s\n", ranks, r.seconds);
  }
}

// ModeExecutor's collectives in every mode, against canonical sums rebuilt on each rank.
TEST(ParallelMpi, ModeExecutorOnTwoThreeAndFourRanks) {
  REQUIRE_MPIRUN();
  for (int ranks : {2, 3, 4}) {
    ShellResult r = Shell(Mpirun(ranks) + Bin("forge_parallel_check") + " executor");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("PARALLEL_CHECK OK"), std::string::npos) << r.output;
    for (const char* mode : {"mode=ddp", "mode=zero1", "mode=fsdp"})
      EXPECT_NE(r.output.find(mode), std::string::npos) << r.output;
    if (ranks == 4) EXPECT_NE(r.output.find("mode=hsdp"), std::string::npos) << r.output;
    std::printf("[ executor %d ranks ] %.1f s\n", ranks, r.seconds);
  }
}

struct TrajectoryCase {
  int ranks;
  int64_t global;
  int micro;
  const char* expect;  // "bitwise" or "close"
};

void PrintTo(const TrajectoryCase& c, std::ostream* os) {
  *os << c.ranks << " ranks, global " << c.global << ", micro " << c.micro << ", " << c.expect;
}

class ParallelTrajectory : public ::testing::TestWithParam<TrajectoryCase> {};

TEST_P(ParallelTrajectory, MatchesOneProcess) {
  REQUIRE_MPIRUN();
  const TrajectoryCase c = GetParam();
  ShellResult r = Shell(Mpirun(c.ranks) + Bin("forge_parallel_check") +
                        " trajectory --steps 5 --global " + std::to_string(c.global) + " --micro " +
                        std::to_string(c.micro) + " --expect " + c.expect);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("PARALLEL_CHECK OK"), std::string::npos) << r.output;
  // One line per mode, each naming its world size: all four modes ran.
  for (const char* mode : {"mode=ddp", "mode=zero1", "mode=zero2", "mode=fsdp"})
    EXPECT_NE(r.output.find(mode), std::string::npos) << r.output;
  std::printf("%s[ %.1f s ]\n", r.output.c_str(), r.seconds);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, ParallelTrajectory,
    ::testing::Values(
        // global 8, micro 1: 8 / 4 / 2 micro-steps per rank
        TrajectoryCase{1, 8, 1, "bitwise"}, TrajectoryCase{2, 8, 1, "bitwise"},
        TrajectoryCase{4, 8, 1, "bitwise"},
        // global 8, micro 2: 4 / 2 / 1 micro-steps per rank
        TrajectoryCase{1, 8, 2, "bitwise"}, TrajectoryCase{2, 8, 2, "bitwise"},
        TrajectoryCase{4, 8, 2, "bitwise"},
        // not a power of two: bitwise with one micro-step per rank, else within tolerance
        TrajectoryCase{3, 3, 1, "bitwise"}, TrajectoryCase{3, 6, 1, "close"}),
    [](const ::testing::TestParamInfo<TrajectoryCase>& i) {
      return "w" + std::to_string(i.param.ranks) + "_g" + std::to_string(i.param.global) + "_mb" +
             std::to_string(i.param.micro) + "_" + i.param.expect;
    });

// hsdp (parallel/hybrid_groups.h): 4 ranks as 2 shard groups x 2, and the degenerate 4 x 1
// (ddp-like) and 1 x 4 (fsdp), with several and with one micro-step per rank; 2 ranks as 1 x 2
// and 2 x 1. R and G are powers of two, so each is bitwise one process on the same global batch,
// and every replica group ends with bitwise the same weights and moments. World 3 (3 x 1 and
// 1 x 3, 2 micro-steps per rank) is within the tolerance of the other modes' world 3.
TEST(ParallelMpi, HsdpMatchesOneProcessAndReplicasAgree) {
  REQUIRE_MPIRUN();
  struct Case {
    int ranks;
    const char* args;
  };
  for (const Case& k : {Case{4, "--global 8 --micro 1 --modes hsdp2,hsdp1,hsdp4"},
                        Case{4, "--global 8 --micro 2 --modes hsdp2"},
                        Case{2, "--global 8 --micro 2 --modes hsdp2,hsdp1"},
                        Case{3, "--global 6 --micro 1 --modes hsdp3,hsdp1 --expect close"}}) {
    ShellResult r = Shell(Mpirun(k.ranks) + Bin("forge_parallel_check") +
                          " trajectory --steps 5 " + k.args);
    EXPECT_EQ(r.exit_code, 0) << k.args << "\n" << r.output;
    EXPECT_NE(r.output.find("PARALLEL_CHECK OK"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("REPLICAS DIFFER"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("mode=hsdp"), std::string::npos) << r.output;
    std::printf("%s[ -np %d %s: %.1f s ]\n", r.output.c_str(), k.ranks, k.args, r.seconds);
  }
}

// Rank 1 never joins an all-reduce; rank 0 waits for it with a 1 s timeout.
TEST(ParallelMpi, HungCollectiveTimesOutNamingRankAndCollective) {
  REQUIRE_MPIRUN();
  ShellResult r = Shell(Mpirun(2, 60) + Bin("forge_parallel_check") + " hang --timeout 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung until the test's own limit:\n" << r.output;
  EXPECT_NE(r.output.find("rank 0: all_reduce #2 (hang test, 1024 x f32) timed out"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("parallel.collective_timeout_s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("aborting the job"), std::string::npos) << r.output;
  // The error comes at the timeout (not before, and within the watchdog's tick after it), and
  // the job ends soon after (startup ~0.5 s + timeout 1 s + abort).
  const std::string key = "rank 0: Wait() returned the error after ";
  const size_t at = r.output.find(key);
  ASSERT_NE(at, std::string::npos) << r.output;
  const double waited = std::atof(r.output.c_str() + at + key.size());
  EXPECT_GE(waited, 1.0);
  EXPECT_LT(waited, 2.5);  // generous: 2 shared cores under load
  EXPECT_LT(r.seconds, 10.0) << r.output;
  std::printf("[ hung collective: job ended after %.1f s ]\n", r.seconds);
}

// Same, but rank 0 never waits either: only the watchdog can notice, and it ends the job.
TEST(ParallelMpi, UnwaitedHungCollectiveIsAbortedByTheWatchdog) {
  REQUIRE_MPIRUN();
  ShellResult r =
      Shell(Mpirun(2, 60) + Bin("forge_parallel_check") + " hang --timeout 1 --unwaited");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung until the test's own limit:\n" << r.output;
  EXPECT_NE(r.output.find("nobody waited for the failed collective: rank 0: all_reduce #2"),
            std::string::npos)
      << r.output;
  EXPECT_GE(r.seconds, 2.0);  // timeout 1 s + abort grace 1 s
  EXPECT_LT(r.seconds, 12.0) << r.output;
  std::printf("[ unwaited hung collective: job ended after %.1f s ]\n", r.seconds);
}

// ---------------------------------------------------------------------------------------
// `forge train CONFIG` under mpirun on a small synthetic dataset.

std::string TempDir() {
  return ::testing::TempDir() + "/forge_parallel_mpi_" + std::to_string(::getpid());
}

void WriteDataset(const std::string& dir) {
  test::WriteCountingDataset(dir, 12345u, 40000, 4000);
}

// The metrics records without their timing fields (which differ run to run).
std::vector<std::string> MetricsWithoutTimings(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    for (const char* key : {",\"tokens_per_s\":", ",\"step_seconds\":"}) {
      const size_t a = line.find(key);
      if (a == std::string::npos) continue;
      const size_t b = line.find_first_of(",}", a + 1);
      line.erase(a, b - a);
    }
    out.push_back(line);
  }
  return out;
}

int CountOccurrences(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

void WriteTrainConfig(const std::string& dir, const std::string& cfg,
                      const std::string& parallel) {
  std::ofstream y(cfg);
  y << "name: mpi-test\nseed: 5\n"
       "model: {n_layer: 2, d_model: 32, n_head: 4, n_kv_head: 2, ffn: 64, vocab: 256, "
       "seq_len: 16}\n"
       "data: {dataset_dir: "
    << dir
    << "/data}\n"
       "schedule: {total_steps: 6, warmup_steps: 2}\n"
       "batch: {micro_batch: 2, global_batch: 8}\n"
       "parallel: {"
    << parallel
    << ", collective_timeout_s: 60}\n"
       "eval: {every_steps: 3, batches: 3}\n"
       "train: {backend: cpu, log_every: 1, run_dir: "
    << dir << "/run}\n";
}

TEST(ParallelMpi, ForgeTrainUnderMpirunMatchesOneProcess) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir();
  fs::remove_all(dir);
  WriteDataset(dir + "/data");
  const std::string cfg = dir + "/run.yaml";
  WriteTrainConfig(dir, cfg, "mode: fsdp");
  ShellResult one = Shell("OPENBLAS_NUM_THREADS=1 timeout 120 " + Bin("forge") + " train " + cfg +
                          " --run-dir " + dir + "/one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ShellResult four =
      Shell(Mpirun(4) + Bin("forge") + " train " + cfg + " --run-dir " + dir + "/four");
  ASSERT_EQ(four.exit_code, 0) << four.output;
  std::printf("[ forge train: 1 process %.1f s, mpirun -np 4 %.1f s ]\n%s", one.seconds,
              four.seconds, four.output.c_str());

  // Only rank 0 talks: one header, one line per step, one summary.
  EXPECT_EQ(CountOccurrences(four.output, "forge: training"), 1) << four.output;
  EXPECT_NE(four.output.find("x 4 ranks (fsdp)"), std::string::npos) << four.output;
  EXPECT_EQ(CountOccurrences(four.output, "step 6/6"), 1) << four.output;
  EXPECT_EQ(CountOccurrences(four.output, "forge: done"), 1) << four.output;
  // The same global batch gives the same records, to the printed digits (bitwise in fact:
  // world 4 is a power of two).
  const auto a = MetricsWithoutTimings(dir + "/one/metrics.jsonl");
  const auto b = MetricsWithoutTimings(dir + "/four/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  fs::remove_all(dir);
}

// forge train with parallel.mode hsdp: its ranks read their data positions' micro-batches
// (process_run.cc), so 4 ranks as 2 x 2 give one process's records; a group size that does
// not divide the world is refused on every rank, naming the key.
TEST(ParallelMpi, ForgeTrainHsdpMatchesOneProcessAndRefusesABadGroupSize) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir() + "_hsdp";
  fs::remove_all(dir);
  WriteDataset(dir + "/data");
  const std::string one_cfg = dir + "/one.yaml", hsdp_cfg = dir + "/hsdp.yaml",
                    bad_cfg = dir + "/bad.yaml";
  WriteTrainConfig(dir, one_cfg, "mode: ddp");
  WriteTrainConfig(dir, hsdp_cfg, "mode: hsdp, shard_group_size: 2");
  WriteTrainConfig(dir, bad_cfg, "mode: hsdp, shard_group_size: 3");
  ShellResult one = Shell("OPENBLAS_NUM_THREADS=1 timeout 120 " + Bin("forge") + " train " +
                          one_cfg + " --run-dir " + dir + "/one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ShellResult four =
      Shell(Mpirun(4) + Bin("forge") + " train " + hsdp_cfg + " --run-dir " + dir + "/four");
  ASSERT_EQ(four.exit_code, 0) << four.output;
  std::printf("[ forge train hsdp 2 x 2: %.1f s ]\n%s", four.seconds, four.output.c_str());
  EXPECT_NE(four.output.find("x 4 ranks (hsdp)"), std::string::npos) << four.output;
  const auto a = MetricsWithoutTimings(dir + "/one/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, MetricsWithoutTimings(dir + "/four/metrics.jsonl"));

  ShellResult bad =
      Shell(Mpirun(4) + Bin("forge") + " train " + bad_cfg + " --run-dir " + dir + "/bad");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("parallel.shard_group_size (3) must divide the world size (4)"),
            std::string::npos)
      << bad.output;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
