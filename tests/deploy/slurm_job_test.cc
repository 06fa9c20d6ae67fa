// deploy/slurm/forge-train.sbatch on a real one-node Slurm cluster on loopback
// (tests/deploy/slurm_cluster.sh: munged, slurmctld, slurmd; 4 GPUs emulated as gres on
// mknod'ed devices). Coordinator launch (the default): the job starts forge-coordinator, 4
// forge-workers under srun and submits the config with forgectl; the run completes; scancel
// leaves a committed checkpoint and resubmitting resumes the same run from it; the time-limit
// warning stops the run with a checkpoint and requeues the job, which finishes the run; kill -9
// of a worker fails the worker step, which the job launches again in its allocation, counting
// the failure against the worker's node (excluded past train.node_failure_limit where the rest
// of the allocation keeps train.min_workers, and tried again after train.node_cooldown_s: on
// two nodes, slurm_multinode_test.cc). Direct
// launch (FORGE_LAUNCH=direct: `srun forge train`): scancel checkpoints and a resubmission
// resumes. Skips when not root or when slurm-wlm/munge are not installed.
#include <gtest/gtest.h>

#include <string>

#include "slurm_fixture.h"

namespace forge {
namespace {

using test::Contains;
using test::CountLines;
using test::ReadFile;

class SlurmJob : public test::SlurmFixture {};

TEST_F(SlurmJob, CoordinatorAndFourWorkersTrainToCompletion) {
  const std::string cfg = WriteConfig("complete", 6, 3);
  const std::string job = Submit(cfg);
  ASSERT_FALSE(job.empty());
  Log("$ squeue\n%s", Run("squeue").c_str());
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_EQ(JobField(job, "ExitCode"), "0:0");
  ExpectOneGpuPerRank(log);
  const std::string run = RunIdOf("complete");
  ASSERT_FALSE(run.empty()) << log;
  EXPECT_TRUE(Contains(log, "submitted " + run)) << log;
  EXPECT_TRUE(Contains(log, "rank 0 of 4")) << log;
  EXPECT_TRUE(Contains(log, "x 4 ranks (zero2)")) << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 6")) << log;
  const auto ckpts = ListCheckpoints(CoordinatorRunDir("complete") + "/checkpoints");
  ASSERT_FALSE(ckpts.empty()) << log;
  EXPECT_EQ(ckpts.back().step, 6);
}

// kill -9 of one worker ends the whole worker step (the coordinator aborts the others); the job
// launches the step again in its allocation and the coordinator resumes the run on the new workers from the
// last committed checkpoint.
TEST_F(SlurmJob, CoordinatorRelaunchesAWorkerStepThatFailed) {
  // 60 steps of >= 50 ms (3 s): the run is far from done when a worker is killed.
  ::setenv("FORGE_WORKER_ARGS", "--throttle-ms 50", 1);
  const std::string cfg = WriteConfig("relaunch", 60, 5);
  const std::string job = Submit(cfg);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitFor(60, [&] { return !RunIdOf("relaunch").empty(); })) << JobLog(job);
  const std::string run = RunIdOf("relaunch");
  const std::string run_dir = CoordinatorRunDir("relaunch");
  ASSERT_TRUE(WaitFor(60, [&] { return !ListCheckpoints(run_dir + "/checkpoints").empty(); }))
      << JobSummary(job) << JobLog(job);
  ASSERT_LT(ListCheckpoints(run_dir + "/checkpoints").back().step, 60);
  // One of this job's forge-worker processes.
  ASSERT_NO_FATAL_FAILURE(KillWorkerOf(job));
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_TRUE(Contains(log, "worker step failed (exit ")) << log;
  EXPECT_TRUE(Contains(log, "relaunching it in 1 s (1 of 3)")) << log;
  EXPECT_TRUE(Contains(log, "[RESTARTING]")) << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 60")) << log;
  EXPECT_EQ(ListCheckpoints(run_dir + "/checkpoints").back().step, 60);
}

// The job counts which node's workers ended each failed step. On this one-node cluster the
// node that failed train.node_failure_limit (2) times cannot be excluded: the rest of the
// allocation would hold 0 workers, below train.min_workers 2; the job says so and relaunches
// on it (the exclusion itself and the trial step on every node after train.node_cooldown_s
// that grows the run back: slurm_multinode_test.cc, on two nodes).
TEST_F(SlurmJob, CoordinatorCountsFailuresPerNodeAndKeepsANodeItCannotSpare) {
  ::setenv("FORGE_WORKER_ARGS", "--throttle-ms 50", 1);
  const std::string cfg =
      WriteConfig("nodefail", 200, 5, "min_workers: 2, node_failure_limit: 2, ");
  const std::string job = Submit(cfg);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitFor(60, [&] { return !RunIdOf("nodefail").empty(); })) << JobLog(job);
  const std::string run = RunIdOf("nodefail");
  const std::string run_dir = CoordinatorRunDir("nodefail");
  const std::string host = Run("hostname -s").substr(0, Run("hostname -s").find('\n'));
  long last_step = -1;
  for (int round = 1; round <= 2; ++round) {
    // Past a new checkpoint, then kill -9 one of the step's forge-worker processes.
    const int64_t before =
        ListCheckpoints(run_dir + "/checkpoints").empty()
            ? 0
            : ListCheckpoints(run_dir + "/checkpoints").back().step;
    ASSERT_TRUE(WaitFor(90, [&] {
      const auto c = ListCheckpoints(run_dir + "/checkpoints");
      return !c.empty() && c.back().step > before;
    })) << JobSummary(job) << JobLog(job);
    // A worker of the job's newest step (a failed step's can linger until aborted).
    long victim_step = -1;
    const long victim = WorkerOf(job, "", -1, &victim_step);
    ASSERT_NE(victim, 0) << Run("ps -ef");
    ASSERT_GT(victim_step, last_step) << "no worker of a new step";
    last_step = victim_step;
    KillWorker(victim, job, "", victim_step);
    ASSERT_TRUE(WaitFor(60, [&] {
      return Contains(JobLog(job), "failure " + std::to_string(round) + " of " + host);
    })) << JobLog(job);
  }
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_TRUE(Contains(log, "worker step failed on " + host + " (rank ")) << log;
  EXPECT_TRUE(Contains(log, "exit 137): failure 2 of " + host)) << log;
  EXPECT_TRUE(Contains(log, "node " + host + " failed 2 time(s) (train.node_failure_limit 2): "
                            "not excluded: the other node(s) hold 0 worker(s); the run needs "
                            "train.min_workers 2"))
      << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 200")) << log;
}

TEST_F(SlurmJob, CoordinatorScancelCheckpointsAndResubmittingResumes) {
  // 200 steps of >= 50 ms (10 s): the run is far from done when its stop lands.
  ::setenv("FORGE_WORKER_ARGS", "--throttle-ms 50", 1);
  const std::string cfg = WriteConfig("cancel", 200, 0);  // only the stop saves
  const std::string job = Submit(cfg);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitFor(60, [&] { return !RunIdOf("cancel").empty(); })) << JobLog(job);
  const std::string run_dir = CoordinatorRunDir("cancel");
  ASSERT_TRUE(WaitForSteps(run_dir, 3)) << JobSummary(job) << JobLog(job);
  Log("$ squeue\n%s$ scancel %s\n", Run("squeue").c_str(), job.c_str());
  Run("scancel " + job);
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "CANCELLED") << log;
  const std::string run = RunIdOf("cancel");
  EXPECT_TRUE(Contains(log, "SIGTERM: stopping the run with a checkpoint")) << log;
  const auto ckpts = ListCheckpoints(run_dir + "/checkpoints");
  ASSERT_EQ(ckpts.size(), 1u) << log;  // committed: ListCheckpoints needs the manifest
  const int64_t stopped = ckpts[0].step;
  EXPECT_GE(stopped, 3);
  EXPECT_LT(stopped, 200);
  EXPECT_TRUE(Contains(log, "run " + run + ": STOPPED at step " + std::to_string(stopped)))
      << log;

  ::setenv("FORGE_WORKER_ARGS", "", 1);
  const std::string again = Submit(cfg);
  ASSERT_FALSE(again.empty());
  const auto [state2, log2] = AwaitJob(again);
  ASSERT_EQ(state2, "COMPLETED") << log2;
  EXPECT_TRUE(Contains(log2, "run " + run + " (STOPPED, checkpoint step " +
                                 std::to_string(stopped) + ")"))
      << log2;
  EXPECT_TRUE(Contains(log2, "resumed from " + run_dir + "/checkpoints/step_" +
                                 std::to_string(stopped)))
      << log2;
  EXPECT_TRUE(Contains(log2, "run " + run + ": COMPLETED at step 200")) << log2;
  EXPECT_EQ(CountLines(run_dir + "/metrics.jsonl"), 200);
}

// `#SBATCH --signal=B:USR1@180` sends this near the time limit; here scancel sends it now.
TEST_F(SlurmJob, CoordinatorTimeLimitWarningCheckpointsAndRequeues) {
  // 150 steps of >= 40 ms (6 s): the run is far from done when its stop lands.
  ::setenv("FORGE_WORKER_ARGS", "--throttle-ms 40", 1);
  const std::string cfg = WriteConfig("requeue", 150, 0);
  const std::string job = Submit(cfg);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitFor(60, [&] { return !RunIdOf("requeue").empty(); })) << JobLog(job);
  const std::string run = RunIdOf("requeue");
  const std::string run_dir = CoordinatorRunDir("requeue");
  ASSERT_TRUE(WaitForSteps(run_dir, 3)) << JobSummary(job) << JobLog(job);
  Log("$ scancel --batch --signal=USR1 %s\n", job.c_str());
  Run("scancel --batch --signal=USR1 " + job);
  // The job requeues itself; Slurm holds a requeued job ~2 min (its BeginTime): start it
  // sooner, but only once the node is idle and the second of the kill has passed (slurmd
  // refuses a job id's credential issued in the same second it was revoked).
  ASSERT_TRUE(WaitFor(60, [&] { return JobField(job, "Restarts") == "1"; })) << JobLog(job);
  ASSERT_TRUE(WaitFor(30, [&] { return JobField(job, "JobState") == "PENDING"; }))
      << JobSummary(job);
  ASSERT_TRUE(WaitFor(30, [&] { return Run("sinfo -h -o %T") == "idle\n"; })) << Run("sinfo");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  Log("$ squeue\n%s$ scontrol update JobId=%s StartTime=now\n",
      Run("squeue -o '%.8i %.9P %.8j %.8T %.10M %.6D %R %S'").c_str(), job.c_str());
  Run("scontrol update JobId=" + job + " StartTime=now");
  const auto [state, log] = AwaitJob(job);  // --open-mode=append: both runs
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_TRUE(Contains(log, "time limit near")) << log;
  EXPECT_TRUE(Contains(log, "requeueing job " + job)) << log;
  EXPECT_TRUE(Contains(log, "(restart 1)")) << log;
  EXPECT_TRUE(Contains(log, "resumed from " + run_dir + "/checkpoints/step_")) << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 150")) << log;
  EXPECT_EQ(CountLines(run_dir + "/metrics.jsonl"), 150);
}

// FORGE_LAUNCH=direct: every rank is `forge train`; SIGTERM from scancel reaches each one.
TEST_F(SlurmJob, DirectScancelCheckpointsAndResubmittingResumes) {
  ::setenv("FORGE_LAUNCH", "direct", 1);
  const std::string cfg = WriteConfig("direct", 100000, 0);  // only the stop saves
  const std::string run = dir_ + "/runs/direct";
  const std::string job = Submit(cfg);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitForSteps(run, 3)) << JobSummary(job) << JobLog(job);
  Log("$ squeue\n%s$ scancel %s\n", Run("squeue").c_str(), job.c_str());
  Run("scancel " + job);
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "CANCELLED") << log;
  EXPECT_TRUE(Contains(log, "forge: stopped on a signal after step")) << log;
  const auto ckpts = ListCheckpoints(run + "/checkpoints");
  ASSERT_EQ(ckpts.size(), 1u) << log;
  const int64_t stopped = ckpts[0].step;
  EXPECT_GE(stopped, 3);
  EXPECT_TRUE(Contains(log, "checkpoint step_" + std::to_string(stopped) + ":")) << log;

  // The same command again (two more steps): it resumes from the checkpoint.
  const std::string until = std::to_string(stopped + 2);
  const std::string again = Submit(cfg, "--steps " + until);
  ASSERT_FALSE(again.empty());
  const auto [state2, log2] = AwaitJob(again);
  ASSERT_EQ(state2, "COMPLETED") << log2;
  EXPECT_TRUE(Contains(log2, "resumed from " + run + "/checkpoints/step_" +
                                 std::to_string(stopped)))
      << log2;
  EXPECT_TRUE(Contains(log2, "forge: done: " + until + " steps (2 after resuming at step " +
                                 std::to_string(stopped) + ")"))
      << log2;
  EXPECT_EQ(CountLines(run + "/metrics.jsonl"), stopped + 2);
}

}  // namespace
}  // namespace forge
