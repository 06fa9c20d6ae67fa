// deploy/slurm/forge-train-multinode.sbatch on a real Slurm cluster of two emulated nodes on
// this host (tests/deploy/slurm_cluster.sh with FORGE_SLURM_NODES=2: one slurmd per node, each
// on its own port with its own spool and TmpFS; 2 CPUs and 2 emulated GPUs a node). What a
// multi-node job adds to the one-node one: ranks spread over the nodes with node-local ranks
// from SLURM_LOCALID, the coordinator on the allocation's first node at the address Slurm has
// for it, NCCL's socket interface chosen on each node (the route to the coordinator: lo here)
// and NCCL_IB_HCA kept where the submitter set it (no InfiniBand here: its automatic choice,
// the ACTIVE ports under /sys/class/infiniband, finds none and leaves it unset), and a node
// excluded after a failure that the run grows back onto after train.node_cooldown_s; a failure
// while the step trying it again waits, counted against the failing node (and a run that then
// restarts on the trying step and ends there); a try that fails (the node stays excluded for
// twice its cool-down) and a node back that fails again. Skips
// when not root or when slurm-wlm/munge are not installed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <regex>
#include <string>

#include "slurm_fixture.h"

namespace forge {
namespace {

using test::Contains;

class SlurmTwoNodes : public test::SlurmFixture {
 protected:
  int Nodes() const override { return 2; }
  // Open MPI's shared-memory transport (vader) between ranks that PMIx places on two nodes of
  // one host crashes mapping the other "node's" segments: the ranks talk TCP over loopback, as
  // ranks of two machines talk over their network. (sbatch passes the environment on.)
  void SetUp() override {
    ::setenv("OMPI_MCA_btl", "self,tcp", 1);
    ::setenv("OMPI_MCA_btl_tcp_if_include", "lo", 1);
    test::SlurmFixture::SetUp();
  }
  // Submits a 300-step run of 4 workers (>= 80 ms a step) that may shrink to 2
  // (train.min_workers), with train.node_failure_limit 1 and train.node_cooldown_s
  // `cooldown_s`, and waits for its first checkpoint. Sets the job and run ids, the job step
  // of its workers and one of them on fnode2 (`victim`), and kills nothing.
  void StartShrinkableRun(const std::string& name, int cooldown_s, std::string* job,
                          std::string* run, long* step, long* victim,
                          const std::string& train_extra = "") {
    ::setenv("FORGE_WORKER_ARGS", "--throttle-ms 80", 1);
    *job = Submit(WriteConfig(name, 300, 5,
                              train_extra +
                                  "min_workers: 2, elastic_grace_s: 1, node_failure_limit: 1, "
                                  "node_cooldown_s: " + std::to_string(cooldown_s) + ", "));
    ASSERT_FALSE(job->empty());
    ASSERT_TRUE(WaitFor(60, [&] { return !RunIdOf(name).empty(); })) << JobLog(*job);
    *run = RunIdOf(name);
    ASSERT_TRUE(WaitFor(90, [&] {
      return !ListCheckpoints(CoordinatorRunDir(name) + "/checkpoints").empty();
    })) << JobSummary(*job) << JobLog(*job);
    *victim = WorkerOf(*job, "fnode2", -1, step);
    ASSERT_NE(*victim, 0) << Run("ps -ef");
  }
  void TearDown() override {
    test::SlurmFixture::TearDown();
    ::unsetenv("OMPI_MCA_btl");
    ::unsetenv("OMPI_MCA_btl_tcp_if_include");
  }
};

TEST_F(SlurmTwoNodes, CoordinatorOnTheFirstNodeAndTwoWorkersPerNodeTrainToCompletion) {
  Log("$ sinfo -N\n%s", Run("sinfo -N").c_str());
  const std::string cfg = WriteConfig("twonodes", 6, 3);
  ::unsetenv("NCCL_SOCKET_IFNAME");
  ::setenv("NCCL_IB_HCA", "=mlx5_7:1", 1);  // the submitter's choice, propagated by sbatch
  const std::string job = Submit(cfg);
  ::unsetenv("NCCL_IB_HCA");
  ASSERT_FALSE(job.empty());
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_EQ(JobField(job, "ExitCode"), "0:0");
  EXPECT_EQ(JobField(job, "NodeList"), "fnode[1-2]");
  // Two ranks a node, node-local ranks 0 and 1 (each its node's GPU 0 and 1), the socket
  // interface that reaches the coordinator, the submitter's HCA list.
  for (const char* line :
       {"forge-slurm: rank 0 on fnode1 local 0 NCCL_SOCKET_IFNAME=lo NCCL_IB_HCA==mlx5_7:1 "
         "CUDA_VISIBLE_DEVICES=0\n",
        "forge-slurm: rank 1 on fnode1 local 1 NCCL_SOCKET_IFNAME=lo NCCL_IB_HCA==mlx5_7:1 "
         "CUDA_VISIBLE_DEVICES=1\n",
        "forge-slurm: rank 2 on fnode2 local 0 NCCL_SOCKET_IFNAME=lo NCCL_IB_HCA==mlx5_7:1 "
         "CUDA_VISIBLE_DEVICES=0\n",
        "forge-slurm: rank 3 on fnode2 local 1 NCCL_SOCKET_IFNAME=lo NCCL_IB_HCA==mlx5_7:1 "
         "CUDA_VISIBLE_DEVICES=1\n"})
    EXPECT_TRUE(Contains(log, line)) << line << "\n" << log;
  // The coordinator at fnode1's NodeAddr (both nodes are this host: 127.0.0.1).
  EXPECT_TRUE(Contains(log, "coordinator 127.0.0.1:")) << log;
  const std::string run = RunIdOf("twonodes");
  ASSERT_FALSE(run.empty()) << log;
  EXPECT_TRUE(Contains(log, "x 4 ranks (zero2)")) << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 6")) << log;
  const auto ckpts = ListCheckpoints(CoordinatorRunDir("twonodes") + "/checkpoints");
  ASSERT_FALSE(ckpts.empty()) << log;
  EXPECT_EQ(ckpts.back().step, 6);
}

// Direct launch across the two nodes: every rank is `forge train` under srun --mpi=pmix, the
// CPU backend's MPI world spanning both slurmds.
TEST_F(SlurmTwoNodes, DirectLaunchSpansBothNodes) {
  const std::string cfg = WriteConfig("twonodes_direct", 4, 2);
  ::unsetenv("NCCL_IB_HCA");
  ::setenv("FORGE_LAUNCH", "direct", 1);
  const std::string job = Submit(cfg);
  ::unsetenv("FORGE_LAUNCH");
  ASSERT_FALSE(job.empty());
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "COMPLETED") << log;
  for (const char* line : {"forge-slurm: rank 0 on fnode1 local 0 NCCL_SOCKET_IFNAME=lo NCCL_IB_HCA= ",
                           "forge-slurm: rank 3 on fnode2 local 1 NCCL_SOCKET_IFNAME=lo NCCL_IB_HCA= "})
    EXPECT_TRUE(Contains(log, line)) << line << "\n" << log;
  EXPECT_TRUE(Contains(log, "forge: done: 4 steps")) << log;
}

// A node whose worker fails train.node_failure_limit (1) times is excluded: the run goes on
// with the other node's 2 workers (train.min_workers 2); train.node_cooldown_s (6 s) later the
// job launches a step on both nodes beside the running one, the run grows back onto its 4
// workers at the next checkpoint, and that step finishes the run.
TEST_F(SlurmTwoNodes, ExcludedNodeIsTriedAgainAndTheRunGrowsBack) {
  std::string job, run;
  long step = -1, victim = 0;
  ASSERT_NO_FATAL_FAILURE(StartShrinkableRun("regrow", 6, &job, &run, &step, &victim));
  KillWorker(victim, job, "fnode2", step);
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_TRUE(Contains(log, "worker step failed on fnode2 (rank ")) << log;
  EXPECT_TRUE(Contains(log, "node fnode2 failed 1 time(s) (train.node_failure_limit 1): "
                            "excluded; the run goes on with 2 worker(s)"))
      << log;
  EXPECT_TRUE(Contains(log, "(world 4 -> 2; elastic: 4 requested, 2 available")) << log;
  EXPECT_TRUE(Contains(log, "node(s) fnode2 excluded long enough (train.node_cooldown_s): "
                            "trying every node again"))
      << log;
  EXPECT_TRUE(Contains(log, "4 workers available again: world 2")) << log;
  EXPECT_TRUE(Contains(log, "(world 2 -> 4)")) << log;
  EXPECT_TRUE(Contains(log, "node(s) fnode2 back")) << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 300")) << log;
}

// The worker step fails while a step on every node waits beside it (fnode2 excluded, its
// cool-down passed; that step's workers are held before they start, so the run cannot grow
// back onto them first). The failure counts like any other: against the node whose worker
// ended it (fnode1, whose one failure, train.node_failure_limit 1, excludes it in turn) and
// train.max_restarts. The waiting step, which holds fnode1 too, is ended; fnode2 is back. The
// relaunched step on fnode2 is held in turn, so the run restarts on the next step on every
// node (after fnode1's cool-down) and finishes there: that step ended well, no failure.
TEST_F(SlurmTwoNodes, AStepFailingWhileATrialStepWaitsCountsAgainstItsOwnNode) {
  HoldableWorkers();
  std::string job, run;
  long step = -1, first = 0;
  ASSERT_NO_FATAL_FAILURE(StartShrinkableRun("failwait", 4, &job, &run, &step, &first));
  // Steps: `step` on both nodes, step + 1 on fnode1 alone, step + 2 the first on every node,
  // step + 3 on fnode2 alone, step + 4 the next on every node.
  HoldStep(step + 2);
  KillWorker(first, job, "fnode2", step);
  ASSERT_TRUE(WaitFor(60, [&] { return Contains(JobLog(job), "trying every node again"); }))
      << JobLog(job);
  HoldStep(step + 3);
  ASSERT_NO_FATAL_FAILURE(KillWorkerOf(job, "fnode1", step + 1));
  // The run goes on on step + 4's 4 workers; then step + 3's join, idle.
  ASSERT_TRUE(WaitFor(60, [&] {
    const std::string log = JobLog(job);
    const size_t first_four = log.find("placed on 4 worker(s)");
    return first_four != std::string::npos &&
           log.find("placed on 4 worker(s)", first_four + 1) != std::string::npos;
  })) << JobLog(job);
  ReleaseStep(step + 3);
  const auto [state, log] = AwaitJob(job);
  ReleaseStep(step + 2);
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_TRUE(Contains(log, "node fnode2 failed 1 time(s) (train.node_failure_limit 1): excluded"))
      << log;
  EXPECT_TRUE(Contains(log, "worker step failed on fnode1 (rank ")) << log;
  EXPECT_TRUE(Contains(log, "node fnode1 failed 1 time(s) (train.node_failure_limit 1): "
                            "excluded; the run goes on with 2 worker(s)"))
      << log;
  EXPECT_TRUE(Contains(log, "the step on every node waiting beside it includes fnode1: ended; "
                            "node(s) fnode2 back on the next step"))
      << log;
  EXPECT_TRUE(Contains(log, "(2 of 3)")) << log;
  EXPECT_FALSE(std::regex_search(log, std::regex("worker step ended \\(exit [1-9]"))) << log;
  EXPECT_TRUE(Contains(log, "node(s) fnode1 excluded long enough")) << log;
  EXPECT_TRUE(Contains(log, "the worker step trying node(s) fnode1 again ended well")) << log;
  EXPECT_FALSE(Contains(log, "again failed")) << log;
  // Two tries (fnode2's, fnode1's), none once the run had ended.
  const std::regex tries("trying every node again");
  EXPECT_EQ(std::distance(std::sregex_iterator(log.begin(), log.end(), tries),
                          std::sregex_iterator()),
            2)
      << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 300")) << log;
}

// The last restart spent while a step on every node waits beside the running one (held before
// its workers start): the failure is not relaunched, the waiting step is ended (it holds the
// failed node) and the job fails rather than waiting on it. The spent step's workers die
// before they join (held too), so the coordinator never places them and the run would wait for
// workers for ever: the job ends two heartbeat timeouts after its last worker step.
TEST_F(SlurmTwoNodes, RestartsUsedUpWhileATrialStepWaitsEndTheJobAndTheTrialStep) {
  HoldableWorkers();
  std::string job, run;
  long step = -1, first = 0;
  ASSERT_NO_FATAL_FAILURE(
      StartShrinkableRun("spent", 3, &job, &run, &step, &first, "max_restarts: 1, "));
  // Steps: `step` on both nodes, step + 1 on fnode1 alone, step + 2 the first on every node.
  HoldStep(step + 1);
  HoldStep(step + 2);
  KillWorker(first, job, "fnode2", step);
  ASSERT_TRUE(WaitFor(60, [&] { return Contains(JobLog(job), "trying every node again"); }))
      << JobLog(job);
  ASSERT_NO_FATAL_FAILURE(KillWorkerOf(job, "fnode1", step + 1));
  const auto [state, log] = AwaitJob(job);
  ReleaseStep(step + 1);
  ReleaseStep(step + 2);
  EXPECT_EQ(state, "FAILED") << log;
  EXPECT_TRUE(Contains(log, "no worker step left and run " + run + " still RESTARTING")) << log;
  EXPECT_TRUE(Contains(log, "worker step failed on fnode1 (rank ")) << log;
  EXPECT_TRUE(Contains(log, "the step on every node waiting beside it includes fnode1: ended"))
      << log;
  EXPECT_TRUE(Contains(log, "not relaunched: 1 relaunch(es) made (train.max_restarts 1)")) << log;
  EXPECT_FALSE(Contains(log, "ended well")) << log;
  EXPECT_FALSE(Contains(log, "COMPLETED at step 300")) << log;
}

// A step trying an excluded node again that fails on it leaves the node excluded for twice its
// cool-down (the step's workers are held before they start, and one on fnode2 is killed); the
// next try grows the run back, and the node, on probation, is excluded again at its next
// failure, for twice that again.
TEST_F(SlurmTwoNodes, ATrialStepFailingDoublesTheCooldownAndANodeBackIsExcludedAgain) {
  HoldableWorkers();
  std::string job, run;
  long step = -1, first = 0;
  ASSERT_NO_FATAL_FAILURE(StartShrinkableRun("retry", 3, &job, &run, &step, &first));
  HoldStep(step + 2);  // the first step on every node after fnode2's cool-down
  KillWorker(first, job, "fnode2", step);
  long held = 0;
  ASSERT_TRUE(WaitFor(60, [&] { return (held = WorkerOf(job, "fnode2", step + 2)) != 0; }))
      << JobLog(job);
  KillWorker(held, job, "fnode2", step + 2);  // the held stand-in: never training
  ASSERT_TRUE(WaitFor(30, [&] { return Contains(JobLog(job), "still excluded"); })) << JobLog(job);
  ReleaseStep(step + 2);
  // The next step on every node (step + 3) takes the run back onto fnode2; one of its workers
  // there fails.
  ASSERT_TRUE(WaitFor(60, [&] { return Contains(JobLog(job), "node(s) fnode2 back"); }))
      << JobLog(job);
  ASSERT_NO_FATAL_FAILURE(KillWorkerOf(job, "fnode2", step + 3));
  const auto [state, log] = AwaitJob(job);
  ASSERT_EQ(state, "COMPLETED") << log;
  EXPECT_TRUE(Contains(log, "node fnode2 failed 1 time(s) (train.node_failure_limit 1): excluded; "
                            "the run goes on with 2 worker(s) on the other node(s) "
                            "(train.min_workers 2); every node is tried again in 3 s"))
      << log;
  EXPECT_TRUE(Contains(log, "the worker step trying node(s) fnode2 again failed on fnode2 (rank "))
      << log;
  EXPECT_TRUE(Contains(log, "exit 137): still excluded, tried again in 6 s (twice the last "
                            "cool-down)"))
      << log;
  EXPECT_TRUE(Contains(log, "node(s) fnode2 back")) << log;
  EXPECT_TRUE(Contains(log, "node fnode2 failed 1 time(s) (train.node_failure_limit 1): excluded; "
                            "the run goes on with 2 worker(s) on the other node(s) "
                            "(train.min_workers 2); every node is tried again in 12 s"))
      << log;
  EXPECT_TRUE(Contains(log, "run " + run + ": COMPLETED at step 300")) << log;
}

}  // namespace
}  // namespace forge
