// The copy-engine all-reduce (parallel.ddp_allreduce: copy_engine) the way workers run it: one
// process per GPU, the peers' buffers mapped with CUDA IPC (threads of one process are refused).
//
// - CopyEngineProcesses.*: this test binary starts itself once per rank (CopyEngineRank.Body,
//   which skips unless FORGE_CE_RANK is set), the NCCL id handed over by the TCP rendezvous on
//   loopback, each rank under `timeout` so a hang fails the test instead of stalling it:
//   - AllReduceSumsInRankOrder (2 and 4 GPUs): ranges of odd sizes and offsets in one
//     registered allocation, three rounds, NCCL all-reduces in between; every element must be
//     the rank-order fp32 sum bit for bit, everything outside the ranges untouched;
//   - SkippedAllReduceTimesOut: rank 1 never joins an all-reduce; rank 0 gets a timeout naming
//     the rank and the collective, and its device still synchronises (the flags released).
// - CopyEngineDdp.TrainsLikeNcclAcrossProcesses: forge-dist-bench (one process per GPU) trains
//   the tiny model on 2 GPUs with NCCL's all-reduce and with the copy engines; the last loss
//   must agree closely (the sums differ only in order), the ranks must end bitwise equal and
//   the bench must say the copy engines were used. Skips without forge-dist-bench beside this
//   binary (both are built into build/bin and packed together for the GPU machine).
// All skip below the GPUs they need.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/port_reservation.h"
#include "common/file_io.h"
#include "gpu_test_util.h"
#include "nccl_test_util.h"
#include "tiny_gpu_config.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/parallel/rendezvous.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// The JSON line a command prints (null if none), its output kept for the failure message.
nlohmann::json RunJson(const std::string& cmd, std::string* output) {
  output->clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return nullptr;
  char buf[4096];
  while (fgets(buf, sizeof buf, p) != nullptr) *output += buf;
  pclose(p);
  size_t at = 0;
  while (at < output->size()) {
    const size_t end = output->find('\n', at);
    const std::string line = output->substr(at, end == std::string::npos ? end : end - at);
    if (!line.empty() && line[0] == '{') return nlohmann::json::parse(line, nullptr, false);
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return nullptr;
}

// ---- one rank (a child process of CopyEngineProcesses.*) -------------------------------------

using test::DeviceBuffer;

void SumsRank(int r, int world, NcclComm* comm) {
  struct Range {
    int64_t off, n;
  };
  const std::vector<Range> ranges = {{0, 1000003}, {1000004, 17}, {1000024, 1}, {1000028, 4096},
                                     {1004124, 3}};
  const int64_t count = 1004124 + 3 + 9;  // a tail no range covers
  DeviceBuffer<float> buf(static_cast<size_t>(count)), other(1000);
  ASSERT_TRUE(comm->EnableCopyEngineAllReduce(buf.data(), count, 1000003).ok());
  for (int round = 0; round < 3; ++round) {
    std::vector<float> h(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) h[i] = Value(r + 11 * round, i) * float(1 + r);
    buf.Upload(h);
    other.Upload(std::vector<float>(1000, float(r + 1)));
    for (const Range& g : ranges) {
      const Status ce = Finish(comm->AllReduceSum(buf.data() + g.off, g.n, DType::kF32, "ce"));
      ASSERT_TRUE(ce.ok()) << ce.ToString();
      const Status nccl = Finish(comm->AllReduceSum(other.data(), 1000, DType::kF32, "nccl"));
      ASSERT_TRUE(nccl.ok()) << nccl.ToString();
    }
    const std::vector<float> got = buf.Download();
    int64_t bad = 0;
    std::vector<bool> covered(static_cast<size_t>(count), false);
    for (const Range& g : ranges) {
      for (int64_t i = g.off; i < g.off + g.n; ++i) {
        covered[i] = true;
        // Each rank's value as uploaded (a rounded product), then added in rank order.
        float want = Value(0 + 11 * round, i);
        for (int q = 1; q < world; ++q) {
          volatile float v = Value(q + 11 * round, i) * float(1 + q);
          want += v;
        }
        bad += std::memcmp(&want, &got[i], 4) != 0;
      }
    }
    for (int64_t i = 0; i < count; ++i) bad += !covered[i] && got[i] != h[i];
    EXPECT_EQ(bad, 0) << "round " << round << ": wrong floats";
  }
}

void SkipRank(int r, NcclComm* comm, const fs::path& dir) {
  DeviceBuffer<float> d(4096);
  cudaMemset(d.data(), 0, 4096 * sizeof(float));
  ASSERT_TRUE(comm->EnableCopyEngineAllReduce(d.data(), 4096, 4096).ok());
  const Status warm = Finish(comm->AllReduceSum(d.data(), 4096, DType::kF32, "warm-up"));
  ASSERT_TRUE(warm.ok()) << warm.ToString();
  const fs::path done = dir / "rank0.done";
  if (r == 1) {  // never joins the next all-reduce; its buffer lives until rank 0 is done
    for (int i = 0; i < 900 && !fs::exists(done); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return;
  }
  const Status st = Finish(comm->AllReduceSum(d.data(), 4096, DType::kF32, "skipped by rank 1"));
  std::printf("MESSAGE: %s\n", st.ToString().c_str());
  EXPECT_FALSE(st.ok()) << "the skipped all-reduce completed";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the released stream did not finish";
  std::ofstream(done) << "1";
}

TEST(CopyEngineRank, Body) {
  const char* rank_env = std::getenv("FORGE_CE_RANK");
  if (rank_env == nullptr) GTEST_SKIP() << "one rank of CopyEngineProcesses.* (started by them)";
  ReserveCudaQueuesForCopyEngine();  // before this process's first CUDA call, as workers do
  const int r = std::atoi(rank_env), world = std::atoi(std::getenv("FORGE_CE_WORLD"));
  const std::string scenario = std::getenv("FORGE_CE_SCENARIO");
  const fs::path dir = std::getenv("FORGE_CE_DIR");
  ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
  TcpRendezvousOptions t;
  t.port = std::atoi(std::getenv("MASTER_PORT"));
  t.timeout_s = 60;
  auto rdv = MakeTcpRendezvous(t);
  NcclCommOptions o;
  o.device = r;
  o.timeout_s = scenario == "skip" ? 15 : 60;  // 15 s: the first NCCL collective connects
  auto comm = MakeNcclComm(r, world, rdv.get(), o);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  if (scenario == "sums") SumsRank(r, world, comm->get());
  if (scenario == "skip") SkipRank(r, comm->get(), dir);
}

// ---- the parents ----------------------------------------------------------------------------

struct RankResult {
  int rc = -1;
  std::string log;
};

// Starts `world` copies of this binary as ranks of `scenario`, each under a 120 s timeout.
std::vector<RankResult> RunRankProcesses(const std::string& scenario, int world) {
  const fs::path exe = fs::read_symlink("/proc/self/exe");
  const fs::path dir = fs::temp_directory_path() /
                       ("forge-ce-" + scenario + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const test::PortReservation reserved;  // rank 0's rendezvous binds it (port_reservation.h)
  const int port = reserved.port();
  // `cd DIR && (rank 0) & (rank 1) & ...` would put the cd inside rank 0's background job.
  std::string cmd = "cd " + dir.string() + " || exit 1; ";
  for (int r = 0; r < world; ++r) {
    cmd += "(FORGE_CE_RANK=" + std::to_string(r) + " FORGE_CE_WORLD=" + std::to_string(world) +
           " FORGE_CE_SCENARIO=" + scenario + " FORGE_CE_DIR=" + dir.string() +
           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " timeout 120 " +
           exe.string() + " --gtest_filter=CopyEngineRank.Body > rank" + std::to_string(r) +
           ".log 2>&1; echo $? > rank" + std::to_string(r) + ".rc) & ";
  }
  cmd += "wait";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // A file the rank's shell never wrote reads as empty (rc -1).
  auto read = [&](const std::string& name) {
    StatusOr<std::string> text = ReadSmallFile((dir / name).string());
    return text.ok() ? std::move(text).value() : std::string();
  };
  std::vector<RankResult> out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::string rc = read("rank" + std::to_string(r) + ".rc");
    out[r].rc = rc.empty() ? -1 : std::atoi(rc.c_str());
    out[r].log = read("rank" + std::to_string(r) + ".log");
  }
  fs::remove_all(dir);
  return out;
}

TEST(CopyEngineProcesses, AllReduceSumsInRankOrder) {
  if (NcclVisibleDevices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  for (int world : {2, 4}) {
    if (world > NcclVisibleDevices()) continue;
    const std::vector<RankResult> ranks = RunRankProcesses("sums", world);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].rc, 0) << "world " << world << ", rank " << r << ":\n" << ranks[r].log;
      EXPECT_NE(ranks[r].log.find("[  PASSED  ] 1 test"), std::string::npos) << ranks[r].log;
    }
  }
}

TEST(CopyEngineProcesses, SkippedAllReduceTimesOut) {
  if (NcclVisibleDevices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const std::vector<RankResult> ranks = RunRankProcesses("skip", 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].rc, 0) << "rank " << r << " (124: it hung):\n" << ranks[r].log;
  }
  const std::string& log = ranks[0].log;
  EXPECT_NE(log.find("rank 0: all_reduce #"), std::string::npos) << log;
  EXPECT_NE(log.find("(skipped by rank 1, 4096 x f32) timed out"), std::string::npos) << log;
}

TEST(CopyEngineDdp, TrainsLikeNcclAcrossProcesses) {
  if (NcclVisibleDevices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const fs::path bench = fs::read_symlink("/proc/self/exe").parent_path() / "forge-dist-bench";
  // Built beside this binary (a build dependency): missing, it was left out of a packing, which
  // must fail the suite rather than skip the only copy-engine run across processes.
  ASSERT_TRUE(fs::exists(bench)) << "no " << bench.string() << " beside the GPU tests";
  const fs::path dir = fs::temp_directory_path() / ("forge-ce-ddp-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const fs::path config = dir / "tiny.yaml";
  std::ofstream(config) << RunConfigToYaml(test::TinyGpuConfig("copy-engine-ddp"));

  auto run = [&](const std::string& how, std::string* out) {
    return RunJson("timeout 240 " + bench.string() + " --config " + config.string() +
                       " --world 2 --mode ddp --steps 4 --warmup 2 --ddp-allreduce " + how,
                   out);
  };
  std::string out_nccl, out_ce;
  const nlohmann::json nccl = run("nccl", &out_nccl);
  const nlohmann::json ce = run("copy_engine", &out_ce);
  fs::remove_all(dir);
  ASSERT_TRUE(nccl.is_object() && nccl.contains("loss")) << out_nccl;
  ASSERT_TRUE(ce.is_object() && ce.contains("loss")) << out_ce;
  EXPECT_EQ(ce["ddp_allreduce"], "copy_engine") << out_ce;
  EXPECT_EQ(nccl["ddp_allreduce"], "nccl") << out_nccl;
  EXPECT_EQ(ce["ranks_bitwise_equal"], true) << out_ce;
  EXPECT_EQ(nccl["ranks_bitwise_equal"], true) << out_nccl;
  const double a = nccl["loss"].get<double>(), b = ce["loss"].get<double>();
  EXPECT_TRUE(std::isfinite(b)) << out_ce;
  // 7 steps of training on 2 ranks; only the summation order of the gradients may differ.
  EXPECT_NEAR(b, a, 2e-3 * std::fabs(a)) << "nccl " << a << ", copy engines " << b;
}

}  // namespace
}  // namespace forge
