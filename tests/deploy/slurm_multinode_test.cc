// deploy/slurm/forge-train-multinode.sbatch on a real Slurm cluster of two emulated nodes on
// this host (tests/deploy/slurm_cluster.sh with FORGE_SLURM_NODES=2: one slurmd per node, each
// on its own port with its own spool and TmpFS; 2 CPUs and 2 emulated GPUs a node). What a
// multi-node job adds to the one-node one: ranks spread over the nodes with node-local ranks
// from SLURM_LOCALID, the coordinator on the allocation's first node at the address Slurm has
// for it, NCCL's socket interface chosen on each node (the route to the coordinator: lo here)
// and NCCL_IB_HCA kept where the submitter set it (no InfiniBand here: its automatic choice,
// the ACTIVE ports under /sys/class/infiniband, finds none and leaves it unset), and a node
// excluded after a failure that the run grows back onto after train.node_cooldown_s. Skips
// when not root or when slurm-wlm/munge are not installed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include "slurm_fixture.h"

namespace forge {
namespace {

using test::Contains;
using test::ReadFile;

class SlurmTwoNodes : public test::SlurmFixture {
 protected:
  int Nodes() const override { return 2; }
  // Open MPI's shared-memory transport (vader) between ranks that PMIx places on two nodes of
  // one host crashes mapping the other "node's" segments: the ranks talk TCP over loopback, as
  // ranks of two machines talk over their network. (sbatch passes the environment on.)
  void SetUp() override {
    ::setenv("OMPI_MCA_btl", "self,tcp", 1);
    ::setenv("OMPI_MCA_btl_tcp_if_include", "lo", 1);
    ::setenv("FORGE_COORDINATOR_METRICS_PORT", "0", 1);  // no fixed port to collide on
    test::SlurmFixture::SetUp();
  }
  void TearDown() override {
    test::SlurmFixture::TearDown();
    ::unsetenv("OMPI_MCA_btl");
    ::unsetenv("OMPI_MCA_btl_tcp_if_include");
    ::unsetenv("FORGE_COORDINATOR_METRICS_PORT");
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
  ::setenv("FORGE_WORKER_ARGS", "--throttle-ms 80", 1);
  const std::string cfg = WriteConfig(
      "regrow", 300, 5,
      "min_workers: 2, elastic_grace_s: 1, node_failure_limit: 1, node_cooldown_s: 6, ");
  const std::string job = Submit(cfg);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(WaitFor(60, [&] { return !RunIdOf("regrow").empty(); })) << JobLog(job);
  const std::string run = RunIdOf("regrow");
  const std::string run_dir = CoordinatorRunDir("regrow");
  ASSERT_TRUE(WaitFor(90, [&] { return !ListCheckpoints(run_dir + "/checkpoints").empty(); }))
      << JobSummary(job) << JobLog(job);
  // A worker of this job on fnode2.
  long victim = 0;
  std::istringstream pids(Run("pgrep -x forge-worker"));
  for (long pid; victim == 0 && pids >> pid;) {
    const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
    if (Contains(env, std::string("SLURM_JOB_ID=") + job + '\0') &&
        Contains(env, std::string("SLURMD_NODENAME=fnode2") + '\0'))
      victim = pid;
  }
  ASSERT_NE(victim, 0) << Run("ps -ef");
  Log("$ kill -9 %ld   # a forge-worker of job %s on fnode2\n", victim, job.c_str());
  Run("kill -9 " + std::to_string(victim));
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

}  // namespace
}  // namespace forge
