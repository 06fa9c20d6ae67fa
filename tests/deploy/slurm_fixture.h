// A one-node Slurm cluster per test (tests/deploy/slurm_cluster.sh: munged, slurmctld, slurmd
// on loopback, 4 CPUs and 4 GPUs emulated as gres on mknod'ed devices), or two emulated nodes
// of 2 CPUs and 2 GPUs each (a fixture whose Nodes() is 2), with helpers to submit
// deploy/slurm/forge-train.sbatch (forge-train-multinode.sbatch) and read what its jobs did. Skips when not root or when
// slurm-wlm/munge are not installed. Tests using it run one at a time (RESOURCE_LOCK in
// cmake/deploy_tests.cmake): every cluster takes the same ports.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "counting_dataset.h"
#include "mpi_launch.h"
#include "worker/checkpoint/checkpoint_dir.h"

namespace forge::test {

namespace fs = std::filesystem;

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline int CountLines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

class SlurmFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    // Normalised: the job scripts print canonical paths.
    dir_ = (fs::path(::testing::TempDir()) / ("forge_slurm_" + std::to_string(::getpid())))
               .lexically_normal()
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ShellResult up = Shell("FORGE_SLURM_NODES=" + std::to_string(Nodes()) + " " +
                           Script("slurm_cluster.sh") + " up " + dir_ + "/cluster");
    if (up.exit_code == 77) GTEST_SKIP() << up.output;
    ASSERT_EQ(up.exit_code, 0) << up.output;
    cluster_up_ = true;
    ::setenv("SLURM_CONF", (dir_ + "/cluster/etc/slurm.conf").c_str(), 1);
    ::setenv("FORGE_BIN_DIR", (std::string(FORGE_BINARY_DIR) + "/bin").c_str(), 1);
    ::setenv("FORGE_STATE_DIR", (dir_ + "/state").c_str(), 1);
    ::setenv("FORGE_COORDINATOR_LISTEN", "127.0.0.1", 1);  // loopback only
    ::setenv("FORGE_HEARTBEAT_TIMEOUT_MS", "5000", 1);     // resubmissions wait this long
    ::setenv("FORGE_COORDINATOR_METRICS_PORT", "any", 1);  // no fixed port to collide on
    ::unsetenv("FORGE_LAUNCH");
    ::unsetenv("FORGE_WORKER_ARGS");
    ::unsetenv("FORGE_COORDINATOR");
    ::setenv("OPENBLAS_NUM_THREADS", "1", 1);
    test::WriteCountingDataset(dir_ + "/data", 321u, 40000, 4000);
    Log("$ slurm_cluster.sh up  (%.1f s)\n$ sinfo\n%s", up.seconds, Run("sinfo").c_str());
  }

  void TearDown() override {
    if (!cluster_up_) return;
    ShellResult down = Shell(Script("slurm_cluster.sh") + " down " + dir_ + "/cluster");
    Log("$ slurm_cluster.sh down  (%.1f s)\n", down.seconds);
    EXPECT_EQ(down.exit_code, 0) << down.output;
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Nodes of the cluster: 1, or 2 emulated on this host (fnode1, fnode2).
  virtual int Nodes() const { return 1; }

  static std::string Script(const std::string& name) {
    return std::string(FORGE_SOURCE_DIR) + "/tests/deploy/" + name;
  }

  void Log(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    va_list ap;
    va_start(ap, fmt);
    std::vprintf(fmt, ap);
    va_end(ap);
    std::fflush(stdout);
  }

  std::string Run(const std::string& cmd) { return Shell("timeout 30 " + cmd).output; }

  // A run config over the test dataset: 2 layers, 4 ranks x micro-batch 2 = global batch 8.
  // run_dir is used by direct launches; the coordinator puts runs under FORGE_STATE_DIR/runs.
  // `train_extra`: more train: keys ("min_workers: 2, ").
  std::string WriteConfig(const std::string& name, int total_steps, int every_steps,
                          const std::string& train_extra = "") {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream y(path);
    y << "name: " << name << "\nseed: 5\n"
      << "model: {n_layer: 2, d_model: 32, n_head: 4, n_kv_head: 2, ffn: 64, vocab: 256, "
         "seq_len: 16}\n"
      << "data: {dataset_dir: " << dir_ << "/data}\n"
      << "schedule: {total_steps: " << total_steps << ", warmup_steps: 2}\n"
      << "batch: {micro_batch: 2, global_batch: 8}\n"
      << "parallel: {mode: zero2, collective_timeout_s: 60}\n"
      << "checkpoint: {every_steps: " << every_steps << ", keep_last: 2}\n"
      << "eval: {every_steps: 0, batches: 2}\n"
      << "train: {" << train_extra << "backend: cpu, log_every: 1, workers: 4, run_dir: " << dir_
      << "/runs/" << name
      << "}\n";
    return path;
  }

  // sbatch forge-train.sbatch CONFIG ARGS (1 CPU per rank: the node has 4); returns the job id.
  // With two nodes: forge-train-multinode.sbatch, 2 ranks on each.
  std::string Submit(const std::string& config, const std::string& args = "") {
    const std::string script = Nodes() == 1 ? "/deploy/slurm/forge-train.sbatch"
                                            : "/deploy/slurm/forge-train-multinode.sbatch";
    const std::string shape = Nodes() == 1 ? "" : "--nodes=2 --ntasks-per-node=2 ";
    const std::string cmd = "sbatch --parsable --cpus-per-task=1 " + shape + "--output=" + dir_ +
                            "/job-%j.out " + std::string(FORGE_SOURCE_DIR) + script + " " +
                            config + " " + args;
    ShellResult r = Shell("cd " + dir_ + " && timeout 30 " + cmd);
    Log("$ %s\n%s", cmd.c_str(), r.output.c_str());
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::string id = r.output.substr(0, r.output.find_first_of(";\n"));
    return id;
  }

  std::string JobField(const std::string& job, const std::string& field) {
    const std::string out = Run("scontrol show job " + job + " -o");
    const size_t a = out.find(" " + field + "=");
    if (a == std::string::npos) return "";
    const size_t b = a + field.size() + 2;
    return out.substr(b, out.find_first_of(" \n", b) - b);
  }

  // Polls every 0.1 s until pred() or `limit_s`; false on time-out.
  template <typename Pred>
  bool WaitFor(double limit_s, Pred pred) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // Waits until the job has ended; returns its final state (COMPLETED, CANCELLED, FAILED...).
  std::string WaitForEnd(const std::string& job, double limit_s = 90) {
    std::string state;
    WaitFor(limit_s, [&] {
      state = JobField(job, "JobState");
      return state == "COMPLETED" || state == "CANCELLED" || state == "FAILED" ||
             state == "TIMEOUT" || state == "NODE_FAIL" || state == "OUT_OF_MEMORY";
    });
    return state;
  }

  // Waits until the job has ended, then records `scontrol show job` and its (shortened) log in
  // the transcript; returns the final state and the whole log.
  struct Ended {
    std::string state, log;
  };
  Ended AwaitJob(const std::string& job) {
    Ended e;
    e.state = WaitForEnd(job);
    e.log = JobLog(job);
    Log("$ scontrol show job %s\n%s--- job log ---\n%s---\n", job.c_str(),
        JobSummary(job).c_str(), Shortened(e.log).c_str());
    return e;
  }

  bool WaitForSteps(const std::string& run, int steps, double limit_s = 60) {
    return WaitFor(limit_s, [&] { return CountLines(run + "/metrics.jsonl") >= steps; });
  }

  // Coordinator launch: the id of the run a config started (kept by forge-job.sh), or "".
  std::string RunIdOf(const std::string& config_name) {
    std::string id = ReadFile(dir_ + "/state/slurm/" + config_name + ".yaml.run");
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    return id;
  }
  std::string CoordinatorRunDir(const std::string& config_name) {
    return dir_ + "/state/runs/" + RunIdOf(config_name);
  }

  std::string JobSummary(const std::string& job) {
    return "JobId=" + job + " JobState=" + JobField(job, "JobState") +
           " ExitCode=" + JobField(job, "ExitCode") + " Restarts=" + JobField(job, "Restarts") +
           " RunTime=" + JobField(job, "RunTime") + "\n";
  }

  std::string JobLog(const std::string& job) { return ReadFile(dir_ + "/job-" + job + ".out"); }

  // A job log for the transcript: long runs of per-step progress lines shortened to a count.
  static std::string Shortened(const std::string& log) {
    std::istringstream in(log);
    std::string out, line;
    int skipped = 0;
    for (int n = 0; std::getline(in, line);) {
      const bool progress = line.rfind("step ", 0) == 0;
      n = progress ? n + 1 : 0;
      if (progress && n > 3) {
        ++skipped;
        continue;
      }
      if (skipped > 0) out += "  [" + std::to_string(skipped) + " more step lines]\n";
      skipped = 0;
      out += line + "\n";
    }
    if (skipped > 0) out += "  [" + std::to_string(skipped) + " more step lines]\n";
    return out;
  }

  // Lets a test hold the workers of a job step before they start (HoldStep): FORGE_BIN_DIR
  // becomes a directory whose forge-worker waits while hold/step.N exists for its step N, then
  // runs the real one; the other programs are links to the real ones. Call before Submit.
  void HoldableWorkers() {
    const std::string bin = dir_ + "/bin", real = std::string(FORGE_BINARY_DIR) + "/bin";
    fs::create_directories(bin);
    fs::create_directories(dir_ + "/hold");
    for (const char* p : {"forge", "forge-coordinator", "forgectl"})
      fs::create_symlink(real + "/" + p, bin + "/" + p);
    std::ofstream(bin + "/forge-worker")
        << "#!/bin/sh\nwhile [ -e " << dir_ << "/hold/step.$SLURM_STEP_ID ]; do sleep 0.1; done\n"
        << "exec " << real << "/forge-worker \"$@\"\n";
    fs::permissions(bin + "/forge-worker", fs::perms::owner_all);
    ::setenv("FORGE_BIN_DIR", bin.c_str(), 1);
  }
  void HoldStep(long step) { std::ofstream(dir_ + "/hold/step." + std::to_string(step)); }
  void ReleaseStep(long step) { fs::remove(dir_ + "/hold/step." + std::to_string(step)); }

  // A forge-worker process (or its held stand-in) of `job` on `node` ("": any) in job step
  // `step` (-1: its newest step); 0 when none. *found_step: the step it belongs to.
  long WorkerOf(const std::string& job, const std::string& node = "", long step = -1,
                long* found_step = nullptr) {
    long victim = 0, victim_step = -1;
    std::istringstream pids(Run("pgrep -x forge-worker"));
    for (long pid; pids >> pid;) {
      const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
      if (!Contains(env, "SLURM_JOB_ID=" + job + '\0')) continue;
      if (!node.empty() && !Contains(env, "SLURMD_NODENAME=" + node + '\0')) continue;
      const size_t at = env.find("SLURM_STEP_ID=");
      const long s = at == std::string::npos ? -1 : std::atol(env.c_str() + at + 14);
      if (step >= 0 ? s == step : s > victim_step) {
        victim = pid;
        victim_step = s;
        if (step >= 0) break;
      }
    }
    if (found_step != nullptr) *found_step = victim_step;
    return victim;
  }

  // kill -9 of forge-worker `pid` of `job`, written to the transcript with where it runs
  // (`node`, job step `step`; "" and -1 leave them out).
  void KillWorker(long pid, const std::string& job, const std::string& node = "",
                  long step = -1) {
    std::string where = node.empty() ? "" : " on " + node;
    if (step >= 0) where += ", step " + std::to_string(step);
    Log("$ kill -9 %ld   # a forge-worker of job %s%s\n", pid, job.c_str(), where.c_str());
    Run("kill -9 " + std::to_string(pid));
  }

  // Kills (-9) a forge-worker of `job` that WorkerOf(job, node, step) finds; a fatal failure
  // when there is none (call it under ASSERT_NO_FATAL_FAILURE).
  void KillWorkerOf(const std::string& job, const std::string& node = "", long step = -1) {
    const long pid = WorkerOf(job, node, step);
    ASSERT_NE(pid, 0) << Run("ps -ef");
    KillWorker(pid, job, node, step);
  }

  // The job log shows 4 ranks, each with its own emulated GPU.
  void ExpectOneGpuPerRank(const std::string& log) {
    std::set<std::string> gpus;
    for (int r = 0; r < 4; ++r) {
      const std::string key = "forge-slurm: rank " + std::to_string(r) + " on ";
      const size_t a = log.find(key);
      ASSERT_NE(a, std::string::npos) << log;
      const size_t g = log.find("CUDA_VISIBLE_DEVICES=", a);
      ASSERT_NE(g, std::string::npos) << log;
      gpus.insert(log.substr(g + 21, log.find('\n', g) - g - 21));
    }
    EXPECT_EQ(gpus, (std::set<std::string>{"0", "1", "2", "3"})) << log;
  }

  std::string dir_;
  bool cluster_up_ = false;
};

}  // namespace forge::test
