// forge-worker --restart-on-abort (the Kubernetes workers' flag), with a real coordinator on
// loopback: a worker the coordinator aborts (here: its run stopped at once, `forgectl stop
// --now`) is replaced by a fresh process inside the same forge-worker, which joins the pool
// again and takes the next run; without the flag the process ends with exit code 3.
#include <gtest/gtest.h>

#include "control_plane_harness.h"

namespace forge {
namespace {

using test::Contains;
using test::ControlPlane;
using test::ReadFile;
using test::ShellResult;
using test::WaitFor;

TEST(WorkerRestartOnAbort, AbortedWorkerJoinsAgainInTheSameProcess) {
  ControlPlane cp("restart_on_abort");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/2000);
  const std::string worker_cmd = test::Bin("forge-worker") + " --coordinator " + cp.address() +
                                 " --join-secret-file " + cp.dir() + "/secret --throttle-ms 100";
  test::Process kept = test::Spawn(worker_cmd + " --restart-on-abort", cp.dir() + "/kept.log");
  const std::string one = "train: {backend: cpu, log_every: 1, workers: 1}\n";
  auto submit = [&](const std::string& name, int64_t steps) {
    const std::string spec = cp.dir() + "/" + name + ".yaml";
    std::ofstream(spec) << "name: " << name << "\nseed: 3\n"
                        << "model: {n_layer: 1, d_model: 32, n_head: 4, ffn: 64, vocab: 256,"
                           " seq_len: 16}\n"
                        << "data: {dataset_dir: " << cp.dir() << "/data}\n"
                        << "schedule: {total_steps: " << steps << ", warmup_steps: 1}\n"
                        << "batch: {micro_batch: 2, global_batch: 2}\n"
                        << "eval: {every_steps: 0, batches: 1}\n"
                        << one;
    ShellResult sub = cp.Ctl("submit " + spec);
    EXPECT_EQ(sub.exit_code, 0) << sub.output;
    return ControlPlane::RunId(sub);
  };
  const std::string first = submit("aborted", 100000);
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(first) >= 2; }))
      << cp.Ctl("status " + first).output << ReadFile(kept.log);
  ASSERT_EQ(cp.Ctl("stop " + first + " --now").exit_code, 0);
  ASSERT_TRUE(WaitFor(30, [&] {
    return Contains(ReadFile(kept.log), "a fresh worker joins again (1 so far)");
  })) << ReadFile(kept.log);
  EXPECT_TRUE(kept.Running()) << ReadFile(kept.log);

  const std::string second = submit("after", 5);
  ShellResult watch = cp.Ctl("watch " + second);
  EXPECT_EQ(watch.exit_code, 0) << watch.output << ReadFile(kept.log);
  EXPECT_EQ(cp.StatusField(second, "state"), "COMPLETED") << ReadFile(kept.log);
  EXPECT_TRUE(kept.Running()) << ReadFile(kept.log);
  kept.Kill(SIGTERM);

  // Without the flag the aborted worker ends with exit code 3 (its launcher's business).
  test::Process plain = test::Spawn(worker_cmd, cp.dir() + "/plain.log");
  const std::string third = submit("plain", 100000);
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(third) >= 2; })) << ReadFile(plain.log);
  ASSERT_EQ(cp.Ctl("stop " + third + " --now").exit_code, 0);
  EXPECT_EQ(plain.Wait(30), 3) << ReadFile(plain.log);
}

}  // namespace
}  // namespace forge
