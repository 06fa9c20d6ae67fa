// Elastic continue with real processes on loopback (forge-coordinator, forge-worker groups
// under mpirun, forgectl): a run asking for 3 workers with train.min_workers 2 loses one
// (kill -9); only a group of 2 comes back, so past train.elastic_grace_s the coordinator
// resumes the last committed checkpoint on 2 (the same global batch: 3 accumulation steps of
// 2 sequences per rank instead of 2); when a group of 3 joins, the 2 save a checkpoint and
// stop, and the run grows back to 3 from it and finishes.
//
// What equality holds: every segment is compared with an unfailed `forge train` that starts
// from the same checkpoint on the same world, bitwise (the checkpoint carries the data cursor;
// the sampler gives world 2 and world 3 the same samples per step, and the CPU backend's sum
// order (worker/parallel/sum_order.h) is fixed for a given world and accumulation count). The
// worlds are not bitwise one another: world 3 with 2 accumulation steps sums the 6
// micro-batches in another fp32 order than world 2 with 3 (parallel_mpi_test.cc: "close").
#include <gtest/gtest.h>

#include <cstring>
#include <regex>
#include <sstream>

#include "control_plane_harness.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge {
namespace {

using test::Contains;
using test::ControlPlane;
using test::ReadFile;
using test::ShellResult;
using test::WaitFor;

std::vector<float> Weights(const std::string& dir) {
  auto ck = LoadFullCheckpoint(dir);
  EXPECT_TRUE(ck.ok()) << dir << ": " << ck.status().ToString();
  std::vector<float> all;
  if (!ck.ok()) return all;
  for (const auto& u : ck->master) all.insert(all.end(), u.begin(), u.end());
  return all;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::string WriteElasticSpec(const ControlPlane& cp, int64_t steps) {
  const std::string path = cp.dir() + "/elastic.yaml";
  std::ofstream(path) << "name: elastic\n"
                      << "seed: 11\n"
                      << "model: {n_layer: 2, d_model: 32, n_head: 4, ffn: 64, vocab: 256,"
                         " seq_len: 16}\n"
                      << "data: {dataset_dir: " << cp.dir() << "/data}\n"
                      << "schedule: {total_steps: " << steps << ", warmup_steps: 2}\n"
                      << "batch: {micro_batch: 2, global_batch: 12}\n"
                      << "checkpoint: {every_steps: 4, keep_last: 100}\n"
                      << "eval: {every_steps: 0, batches: 2}\n"
                      << "train: {backend: cpu, log_every: 1, workers: 3, min_workers: 2,"
                         " elastic_grace_s: 1, max_restarts: 2}\n";
  return path;
}

// kill -9 of one forge-worker rank of an mpirun launch (a descendant of the launch's timeout
// and mpirun processes); mpirun then ends the others.
void KillOneRank(const test::Process& group) {
  std::vector<long> frontier{long(group.pid)}, ranks;
  while (!frontier.empty()) {
    const long parent = frontier.back();
    frontier.pop_back();
    std::istringstream kids(test::Shell("pgrep -P " + std::to_string(parent)).output);
    for (long pid; kids >> pid;) {
      frontier.push_back(pid);
      if (Contains(ReadFile("/proc/" + std::to_string(pid) + "/comm"), "forge-worker"))
        ranks.push_back(pid);
    }
  }
  ASSERT_FALSE(ranks.empty()) << test::Shell("ps -ef").output;
  ::kill(pid_t(ranks.back()), SIGKILL);
}

TEST(ElasticRun, ContinuesOnTwoOfThreeAndGrowsBack) {
  REQUIRE_MPIRUN();
  ControlPlane cp("elastic");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/1500);
  test::Process& three = cp.StartWorkers(3, /*throttle_ms=*/80);
  const int64_t total = 60;
  const std::string spec = WriteElasticSpec(cp, total);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  auto latest = [&] { return std::atoll(cp.StatusField(run, "latest_checkpoint_step").c_str()); };
  ASSERT_TRUE(WaitFor(90, [&] { return latest() >= 8; })) << cp.Ctl("status " + run).output;
  ASSERT_LT(cp.Step(run), total - 20) << "the run got too far before the worker could be killed";

  KillOneRank(three);
  ASSERT_TRUE(WaitFor(30, [&] { return cp.StatusField(run, "state") == "RESTARTING"; }))
      << cp.Ctl("status " + run).output;
  three.Wait(30);

  // Only 2 come back: past the grace period the run goes on with them.
  cp.StartWorkers(2, /*throttle_ms=*/100);
  ASSERT_TRUE(WaitFor(60, [&] {
    return cp.StatusField(run, "state") == "RUNNING" && cp.StatusField(run, "workers") == "2";
  })) << cp.Ctl("watch --history " + run).output;
  const int64_t shrunk_from = latest();
  ASSERT_TRUE(WaitFor(60, [&] { return latest() >= shrunk_from + 8; }))
      << cp.Ctl("watch --history " + run).output;
  ASSERT_LT(cp.Step(run), total - 8) << "the run got too far before the workers came back";

  // 3 are back: the run grows back at a checkpoint and finishes on them.
  cp.StartWorkers(3, /*throttle_ms=*/0);
  ShellResult watch = cp.Ctl("watch --history " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  ASSERT_TRUE(Contains(watch.output, "[COMPLETED]")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "1") << watch.output;  // the grow is not one
  EXPECT_EQ(cp.StatusField(run, "workers"), "3");

  std::smatch shrink, grow;
  ASSERT_TRUE(std::regex_search(
      watch.output, shrink,
      std::regex("attempt 2 placed on 2 worker\\(s\\) .* from step_([0-9]+) \\(world 3 -> 2; "
                 "elastic: 3 requested, 2 available")))
      << watch.output;
  EXPECT_TRUE(Contains(watch.output, "global batch 12 kept as 3 accumulation step(s) of 2"))
      << watch.output;
  EXPECT_TRUE(Contains(watch.output, "3 workers available again: world 2")) << watch.output;
  ASSERT_TRUE(std::regex_search(
      watch.output, grow,
      std::regex("attempt 3 placed on 3 worker\\(s\\) .* from step_([0-9]+) \\(world 2 -> 3\\)")))
      << watch.output;
  const int64_t k = std::atoll(shrink[1].str().c_str());
  const int64_t m = std::atoll(grow[1].str().c_str());
  EXPECT_GT(m, k);
  std::printf("elastic: lost a worker, world 3 -> 2 from step_%ld, grew back 2 -> 3 from step_%ld\n",
              long(k), long(m));

  const std::string ckpts = cp.StatusField(run, "run_dir") + "/checkpoints/";
  auto manifest = ReadManifest(ckpts + "step_" + std::to_string(m));
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  EXPECT_EQ(manifest->world_size, 2);

  // Unfailed references from the same checkpoints: step_k -> step_m on 2 ranks, step_m -> the
  // end on 3.
  const std::string ref2 = cp.dir() + "/reference2", ref3 = cp.dir() + "/reference3";
  ShellResult r2 = test::Shell(test::Mpirun(2) + test::Bin("forge") + " train " + spec +
                               " --run-dir " + ref2 + " --resume " + ckpts + "step_" +
                               std::to_string(k) + " --steps " + std::to_string(m));
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_TRUE(SameBits(Weights(ckpts + "step_" + std::to_string(m)),
                       Weights(ref2 + "/checkpoints/step_" + std::to_string(m))))
      << "the 2-worker segment differs from a 2-rank run resumed at step_" << k;
  ShellResult r3 = test::Shell(test::Mpirun(3) + test::Bin("forge") + " train " + spec +
                               " --run-dir " + ref3 + " --resume " + ckpts + "step_" +
                               std::to_string(m));
  ASSERT_EQ(r3.exit_code, 0) << r3.output;
  const std::string last = "step_" + std::to_string(total);
  EXPECT_TRUE(SameBits(Weights(ckpts + last), Weights(ref3 + "/checkpoints/" + last)))
      << "the final weights differ from a 3-rank run resumed at step_" << m;
}

}  // namespace
}  // namespace forge
