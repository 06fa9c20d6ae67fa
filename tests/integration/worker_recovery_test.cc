// Recovery without a human, with real processes:
//   - `forge train` alone on the CPU with 2 workers supervises one mpirun group of forge-worker
//     processes: kill -9 one and it relaunches the group, the run resumes from its last
//     committed checkpoint and ends with the same weights as an unfailed run resumed from that
//     checkpoint; with train.max_restarts 0 it fails naming the rank and how it ended; a
//     SIGSTOPped worker is caught as hung (train.hang_timeout_s) and replaced; SIGINT stops
//     the run with a checkpoint.
//   - a forge-coordinator with --metrics-port names a SIGSTOPped rank in the run's events,
//     counts it in forge_hangs_total and restarts the run on fresh workers; a rank SIGSTOPped
//     before its group forms is named by its silence, and its peer, waiting in the group's
//     set-up, aborts.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>

#include "../common/http_get.h"
#include "../unit/metrics_test_util.h"
#include "checkpoint_weights.h"
#include "control_plane_harness.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge {
namespace {

using test::Contains;
using test::ControlPlane;
using test::Process;
using test::ReadFile;
using test::ShellResult;
using test::WaitFor;

// The forge-worker processes below `root` (through mpirun and the per-rank shells).
std::vector<pid_t> WorkersUnder(pid_t root) { return test::ProcessesUnder(root, "forge-worker"); }

bool Committed(const std::string& run_dir, int step) {
  return std::filesystem::exists(run_dir + "/checkpoints/step_" + std::to_string(step) +
                                 "/manifest.json");
}

// `forge train SPEC` alone, throttled workers, in the background.
Process StartLocal(const ControlPlane& cp, const std::string& spec, const std::string& run_dir,
                   const std::string& log) {
  // --foreground: timeout passes a signal on to forge once (without it, also to its whole
  // process group, so forge would see a SIGINT twice: the second ends it at once by design).
  return test::Spawn("env OPENBLAS_NUM_THREADS=1 FORGE_WORKER_ARGS='--throttle-ms 60' "
                     "timeout --foreground 170 " +
                         test::Bin("forge") + " train " + spec + " --run-dir " + run_dir,
                     log);
}

std::string WithTrainKeys(const std::string& spec, const std::string& keys) {
  std::string text = ReadFile(spec);
  const std::string at = "max_restarts: 2";
  text.replace(text.find(at), at.size(), keys);
  std::ofstream(spec) << text;
  return spec;
}

TEST(LocalRelaunch, KilledWorkerIsRelaunchedAndTheRunMatchesAResume) {
  REQUIRE_MPIRUN();
  ControlPlane cp("local_kill");
  const std::string spec = cp.WriteSpec("lk", 40, 4);
  const std::string run_dir = cp.dir() + "/run";
  const auto started = std::chrono::steady_clock::now();
  Process forge = StartLocal(cp, spec, run_dir, cp.dir() + "/forge.log");
  ASSERT_TRUE(WaitFor(90, [&] { return Committed(run_dir, 8); })) << ReadFile(forge.log);
  std::vector<pid_t> workers = WorkersUnder(forge.pid);
  ASSERT_EQ(workers.size(), 2u) << ReadFile(forge.log);
  ASSERT_FALSE(Committed(run_dir, 40)) << "the run ended before a worker could be killed";
  ::kill(workers.back(), SIGKILL);

  const int rc = forge.Wait(150);
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::string log = ReadFile(forge.log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_TRUE(Contains(log, "was killed by signal 9")) << log;
  EXPECT_TRUE(Contains(log, "launched 2 worker(s) again")) << log;
  EXPECT_TRUE(Contains(log, "forge: done: 40 steps")) << log;
  // Which checkpoint attempt 2 resumed.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("attempt 2: rank 0 of 2, resuming (\\S+)")))
      << log;
  const std::string resumed = m[1].str();
  EXPECT_TRUE(Contains(resumed, run_dir + "/checkpoints/step_")) << resumed;

  // The closing line's seconds are the steps' own (the workers' 60 ms throttle between steps is
  // not), not the run's wall time with two placements' start-up, and its tokens/s are the
  // tokens of the recorded steps over them (8 x 16 tokens a step; the line rounds the seconds
  // to 0.1, these steps take ms): at least the steps after the checkpoint resumed (the last
  // placement flushes its records; the killed one may not have sent its last), at most the
  // 40 and those trained again.
  std::smatch done;
  ASSERT_TRUE(std::regex_search(
      log, done, std::regex("forge: done: 40 steps in ([0-9.]+) s, ([0-9.]+) tokens/s")))
      << log;
  const double seconds = std::stod(done[1].str()), tokens_per_s = std::stod(done[2].str());
  EXPECT_LT(seconds, wall_s / 2) << log;
  const long resumed_step = std::atol(resumed.substr(resumed.rfind("step_") + 5).c_str());
  const double fewest = tokens_per_s * std::max(0.0, seconds - 0.05) / (8 * 16);
  const double most = tokens_per_s * (seconds + 0.05) / (8 * 16);
  EXPECT_GE(most, 40 - resumed_step - 0.5) << log;
  EXPECT_LE(fewest, 40 + 8 + 0.5) << log;

  // The unfailed reference: `forge train` on 2 ranks, resumed from that same checkpoint.
  const std::string ref_dir = cp.dir() + "/reference";
  ShellResult ref = test::Shell(test::Mpirun(2) + test::Bin("forge") + " train " + spec +
                                " --run-dir " + ref_dir + " --resume " + resumed);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // Both closing lines name the dataset's unigram baseline, the same figure: the launcher reads
  // it from the dataset, the ranks' run from theirs.
  const std::regex baseline("forge: done: .*\\(unigram baseline ([0-9.]+)\\)");
  std::smatch local_base, ref_base;
  ASSERT_TRUE(std::regex_search(log, local_base, baseline)) << log;
  ASSERT_TRUE(std::regex_search(ref.output, ref_base, baseline)) << ref.output;
  EXPECT_EQ(local_base[1].str(), ref_base[1].str());
  const std::vector<float> got = test::CheckpointWeights(run_dir + "/checkpoints/step_40");
  const std::vector<float> want = test::CheckpointWeights(ref_dir + "/checkpoints/step_40");
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "relaunched run's final weights differ from the reference resumed at " << resumed;
}

// A run over workers names the validation loss before its first step in the closing line, as a
// run in one process does: rank 0's evaluation, carried on its step records to the coordinator.
TEST(LocalRelaunch, ClosingLineNamesTheValidationLossBeforeTheFirstStep) {
  REQUIRE_MPIRUN();
  ControlPlane cp("local_val0");
  const std::string spec = cp.WriteSpec("lv", 12, 4);
  Process forge = StartLocal(cp, spec, cp.dir() + "/run", cp.dir() + "/forge.log");
  ASSERT_EQ(forge.Wait(150), 0) << ReadFile(forge.log);
  const std::string log = ReadFile(forge.log);
  std::smatch before, done;
  ASSERT_TRUE(std::regex_search(log, before, std::regex("step 0/12 \\| val loss ([0-9.]+)")))
      << log;
  ASSERT_TRUE(std::regex_search(
      log, done, std::regex("forge: done: 12 steps .* \\| val loss ([0-9.]+) -> ([0-9.]+)")))
      << log;
  EXPECT_EQ(done[1].str(), before[1].str()) << log;
}

TEST(LocalRelaunch, GivesUpAfterMaxRestartsNamingTheRankAndHowItEnded) {
  REQUIRE_MPIRUN();
  ControlPlane cp("local_give_up");
  const std::string spec = WithTrainKeys(cp.WriteSpec("lg", 40, 4), "max_restarts: 0");
  const std::string run_dir = cp.dir() + "/run";
  Process forge = StartLocal(cp, spec, run_dir, cp.dir() + "/forge.log");
  ASSERT_TRUE(WaitFor(90, [&] { return Committed(run_dir, 4); })) << ReadFile(forge.log);
  std::vector<pid_t> workers = WorkersUnder(forge.pid);
  ASSERT_EQ(workers.size(), 2u) << ReadFile(forge.log);
  // Which rank it is: the MPI rank in its environment.
  const std::string env = ReadFile("/proc/" + std::to_string(workers.back()) + "/environ");
  const size_t at = env.find("OMPI_COMM_WORLD_RANK=");
  ASSERT_NE(at, std::string::npos);
  const std::string rank = env.substr(at + 21, env.find('\0', at) - at - 21);
  ::kill(workers.back(), SIGKILL);

  const int rc = forge.Wait(60);
  const std::string log = ReadFile(forge.log);
  EXPECT_EQ(rc, 1) << log;
  EXPECT_TRUE(Contains(log, "rank " + rank + " was killed by signal 9")) << log;
  EXPECT_TRUE(Contains(log, "gave up after 0 restart(s) (train.max_restarts 0)")) << log;
  EXPECT_FALSE(Contains(log, "launched 2 worker(s) again")) << log;
  EXPECT_TRUE(WorkersUnder(forge.pid).empty());
}

TEST(LocalRelaunch, StoppedWorkerIsCaughtAsHungAndReplaced) {
  REQUIRE_MPIRUN();
  ControlPlane cp("local_hang");
  const std::string spec =
      WithTrainKeys(cp.WriteSpec("lh", 40, 4), "max_restarts: 2, hang_timeout_s: 3");
  const std::string run_dir = cp.dir() + "/run";
  Process forge = StartLocal(cp, spec, run_dir, cp.dir() + "/forge.log");
  ASSERT_TRUE(WaitFor(90, [&] { return Committed(run_dir, 4); })) << ReadFile(forge.log);
  std::vector<pid_t> workers = WorkersUnder(forge.pid);
  ASSERT_EQ(workers.size(), 2u) << ReadFile(forge.log);
  ASSERT_FALSE(Committed(run_dir, 40)) << "the run ended before a worker could be stopped";
  ::kill(workers.back(), SIGSTOP);

  const int rc = forge.Wait(150);
  const std::string log = ReadFile(forge.log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_TRUE(Contains(log, "made no step progress")) << log;
  EXPECT_TRUE(Contains(log, "(train.hang_timeout_s 3)")) << log;
  EXPECT_TRUE(Contains(log, "launched 2 worker(s) again")) << log;
  EXPECT_TRUE(Contains(log, "forge: done: 40 steps")) << log;
  EXPECT_NE(::kill(workers.back(), 0), 0) << "the stopped worker was left behind";
}

// Ctrl-C reaches only `forge` (the workers have a process group of their own): the run stops
// with a checkpoint through the coordinator, as a signal stops `forge train` anywhere.
TEST(LocalRelaunch, InterruptStopsTheSupervisedRunWithACheckpoint) {
  REQUIRE_MPIRUN();
  ControlPlane cp("local_stop");
  const std::string spec = cp.WriteSpec("ls", 400, 0);  // only the stop saves
  const std::string run_dir = cp.dir() + "/run";
  Process forge = StartLocal(cp, spec, run_dir, cp.dir() + "/forge.log");
  ASSERT_TRUE(WaitFor(90, [&] {
    return Contains(ReadFile(forge.log), "step 3/400");
  })) << ReadFile(forge.log);
  ::kill(forge.pid, SIGINT);
  const int rc = forge.Wait(60);
  const std::string log = ReadFile(forge.log);
  ASSERT_EQ(rc, 0) << log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("stopped on a signal after step ([0-9]+) "
                                                   "\\(checkpoint step_([0-9]+)\\)")))
      << log;
  EXPECT_EQ(m[1].str(), m[2].str()) << log;
  EXPECT_TRUE(Committed(run_dir, std::atoi(m[1].str().c_str()))) << log;
  EXPECT_FALSE(Contains(log, "launched 2 worker(s) again")) << log;
  EXPECT_TRUE(WorkersUnder(forge.pid).empty());
}

TEST(ControlPlaneHang, StoppedRankIsNamedCountedAndTheRunRestarts) {
  REQUIRE_MPIRUN();
  ControlPlane cp("hang");
  // Heartbeat timeout 60 s: only the hang timeout (3 s) can catch the stopped rank here.
  cp.StartCoordinatorServingMetrics(60000);
  const int metrics_port = cp.metrics_port();
  ASSERT_GT(metrics_port, 0);
  Process& first = cp.StartWorkers(2, /*throttle_ms=*/60);
  const std::string spec =
      WithTrainKeys(cp.WriteSpec("hg", 40, 4), "max_restarts: 2, hang_timeout_s: 3");
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_TRUE(WaitFor(60, [&] {
    return std::atoll(cp.StatusField(run, "latest_checkpoint_step").c_str()) >= 4;
  })) << cp.Ctl("status " + run).output;
  std::vector<pid_t> ranks = WorkersUnder(first.pid);
  ASSERT_EQ(ranks.size(), 2u);
  ::kill(ranks.back(), SIGSTOP);

  ASSERT_TRUE(WaitFor(30, [&] { return cp.StatusField(run, "state") == "RESTARTING"; }))
      << cp.Ctl("status " + run).output;
  const std::string reason = cp.StatusField(run, "state_reason");
  EXPECT_TRUE(Contains(reason, "hang: run " + run + " rank ")) << reason;
  EXPECT_TRUE(Contains(reason, "(worker ")) << reason;
  EXPECT_TRUE(Contains(reason, "made no step progress")) << reason;
  const std::string body = test::HttpGet(metrics_port, "/metrics").body;
  EXPECT_EQ(test::SeriesValue(body, "forge_hangs_total", {{"run_id", run}}), 1.0) << body;

  first.Kill();  // the stopped rank and whatever is left of its group
  cp.StartWorkers(2, /*throttle_ms=*/0);
  ShellResult watch = cp.Ctl("watch --history " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "hang: run " + run)) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "[COMPLETED]")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "1");
}

// A rank stopped between its placement and the group's set-up never takes the assignment; its
// peer waits in MPI_Comm_dup, which no collective timeout covers, so only the peer's heartbeat
// can hear the abort once the stopped rank's silence costs the placement.
TEST(ControlPlaneHang, RankStoppedBeforeTheGroupFormsIsNamedAndItsPeerAborts) {
  REQUIRE_MPIRUN();
  ControlPlane cp("startup");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/4000);
  Process& first = cp.StartWorkers(2, /*throttle_ms=*/0);
  // A short run first, so both ranks have joined and wait, idle, for the next placement.
  ShellResult warm = cp.Ctl("submit --watch " + cp.WriteSpec("w0", 2, 2));
  ASSERT_EQ(warm.exit_code, 0) << warm.output;
  const std::vector<pid_t> ranks = WorkersUnder(first.pid);
  ASSERT_EQ(ranks.size(), 2u);
  const pid_t stopped = ranks.back();
  ::kill(stopped, SIGSTOP);
  // Placed at once on both: the stopped rank's last poll is younger than the timeout.
  ShellResult sub = cp.Ctl("submit " + cp.WriteSpec("st", 20, 4));
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);

  ASSERT_TRUE(WaitFor(30, [&] { return cp.StatusField(run, "state") == "RESTARTING"; }))
      << cp.Ctl("status " + run).output;
  const std::string reason = cp.StatusField(run, "state_reason");
  EXPECT_TRUE(Contains(reason, ":" + std::to_string(stopped) + ":")) << reason;
  EXPECT_TRUE(Contains(reason, "sent no heartbeat")) << reason;
  // The peer heard the abort inside the group's set-up, so the launch group ends by itself.
  const int rc = first.Wait(30);
  EXPECT_NE(rc, -1) << "the launch group still waits for its stopped rank\n"
                    << ReadFile(cp.dir() + "/workers.0.log");
  if (rc == -1) first.Kill();

  cp.StartWorkers(2, /*throttle_ms=*/0);
  ShellResult watch = cp.Ctl("watch " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "COMPLETED")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "1");
}

}  // namespace
}  // namespace forge
