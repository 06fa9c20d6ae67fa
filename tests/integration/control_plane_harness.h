// Real processes for control-plane tests: a forge-coordinator, forge-worker groups under
// mpirun and forgectl, on loopback, in one temp dir with a small counting dataset. Background
// processes run in their own process group, so a test can kill -9 one of them (or a whole
// mpirun and its ranks) and the fixture kills whatever is left.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/reported_port.h"
#include "counting_dataset.h"
#include "mpi_launch.h"

namespace forge::test {

// A background shell command (its own process group); output to `log`.
struct Process {
  pid_t pid = -1;
  std::string log;
  bool Running() const {
    if (pid <= 0) return false;
    return ::waitpid(pid, nullptr, WNOHANG) == 0;
  }
  // Signals the whole group and reaps the leader.
  void Kill(int sig = SIGKILL) {
    if (pid <= 0) return;
    ::kill(-pid, sig);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  // Exit code after it ends by itself (waits up to limit_s; -1 on timeout).
  int Wait(double limit_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(limit_s * 1000));
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }
};

inline Process Spawn(const std::string& cmd, const std::string& log) {
  Process p;
  p.log = log;
  p.pid = ::fork();
  if (p.pid == 0) {
    ::setpgid(0, 0);
    const std::string full = "exec " + cmd + " >" + log + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::setpgid(p.pid, p.pid);
  return p;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The processes named `name` (their /proc/PID/comm) at any depth below `root`, found
// depth-first with the most recent child first.
inline std::vector<pid_t> ProcessesUnder(pid_t root, const std::string& name) {
  std::vector<pid_t> out, todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    std::istringstream kids(Shell("pgrep -P " + std::to_string(p)).output);
    for (long k; kids >> k;) {
      todo.push_back(pid_t(k));
      if (ReadFile("/proc/" + std::to_string(k) + "/comm") == name + "\n") out.push_back(pid_t(k));
    }
  }
  return out;
}

inline bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Polls `done` every 100 ms for up to limit_s.
inline bool WaitFor(double limit_s, const std::function<bool()>& done) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(limit_s * 1000));
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

class ControlPlane {
 public:
  explicit ControlPlane(const std::string& name) {
    dir_ = ::testing::TempDir() + "/forge_cp_" + std::to_string(::getpid()) + "/" + name;
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ + "/token") << "user-token-" << name << "\n";
    std::ofstream(dir_ + "/secret") << "join-secret-" << name << "\n";
    WriteCountingDataset(dir_ + "/data", 777u, 40000, 4000);
  }
  ~ControlPlane() {
    for (Process& p : workers_) p.Kill();
    coordinator_.Kill();
  }
  const std::string& dir() const { return dir_; }
  const std::string& address() const { return address_; }

  // Starts forge-coordinator (port 0 the first time, the same port on a restart; specs may
  // read data under this test's dir); `extra`: more flags (e.g. --metrics-port).
  void StartCoordinator(int heartbeat_timeout_ms = 2000, const std::string& extra = "") {
    const std::string port = address_.empty() ? "0" : address_.substr(address_.rfind(':') + 1);
    std::filesystem::remove(dir_ + "/address");
    coordinator_ = Spawn(Bin("forge-coordinator") + " --state-dir " + dir_ + "/state" +
                             " --listen 127.0.0.1:" + port + " --token-file " + dir_ + "/token" +
                             " --join-secret-file " + dir_ + "/secret" + " --data-root " + dir_ +
                             " --address-file " +
                             dir_ + "/address --heartbeat-interval-ms 200" +
                             " --heartbeat-timeout-ms " + std::to_string(heartbeat_timeout_ms) +
                             " " + extra,
                         dir_ + "/coordinator." + std::to_string(++coordinator_starts_) + ".log");
    ASSERT_TRUE(WaitFor(20, [&] { return std::filesystem::exists(dir_ + "/address"); }))
        << ReadFile(coordinator_.log);
    std::string a = ReadFile(dir_ + "/address");
    while (!a.empty() && a.back() == '\n') a.pop_back();
    address_ = a;
  }
  // StartCoordinator with /metrics on 127.0.0.1 at a port it picks (--metrics-port any),
  // written to metrics-address once it listens: metrics_port().
  void StartCoordinatorServingMetrics(int heartbeat_timeout_ms = 2000,
                                      const std::string& extra = "") {
    std::filesystem::remove(dir_ + "/metrics-address");
    StartCoordinator(heartbeat_timeout_ms, "--metrics-bind 127.0.0.1 --metrics-port any "
                                           "--metrics-address-file " + dir_ +
                                               "/metrics-address " + extra);
  }
  int metrics_port() const { return PortInAddressFile(dir_ + "/metrics-address"); }
  // kill -9 by default; SIGTERM/SIGINT shut it down gracefully.
  void KillCoordinator(int sig = SIGKILL) { coordinator_.Kill(sig); }
  // A signal that does not end it (SIGSTOP, SIGCONT): nothing is reaped.
  void SignalCoordinator(int sig) { ::kill(-coordinator_.pid, sig); }

  // `ranks` forge-worker processes under mpirun (one launch group).
  Process& StartWorkers(int ranks, int throttle_ms, const std::string& extra = "") {
    workers_.push_back(Spawn(Mpirun(ranks, 170) + Bin("forge-worker") + " --coordinator " +
                                 address_ + " --join-secret-file " + dir_ + "/secret" +
                                 " --throttle-ms " + std::to_string(throttle_ms) + " " + extra,
                             dir_ + "/workers." + std::to_string(workers_.size()) + ".log"));
    return workers_.back();
  }

  // forgectl with this coordinator and token.
  ShellResult Ctl(const std::string& args, const std::string& token_file = "") const {
    return Shell(CtlCommand(args, token_file));
  }
  std::string CtlCommand(const std::string& args, const std::string& token_file = "") const {
    return "timeout 120 " + Bin("forgectl") + " --coordinator " + address_ + " --token-file " +
           (token_file.empty() ? dir_ + "/token" : token_file) + " " + args;
  }

  // A small CPU spec: 2 layers, d 32, T 16, 256-token vocabulary.
  std::string WriteSpec(const std::string& name, int64_t steps, int64_t every,
                        const std::string& extra = "") const {
    const std::string path = dir_ + "/" + name + ".yaml";
    std::ofstream(path) << "name: " << name << "\n"
                        << "seed: 11\n"
                        << "model: {n_layer: 2, d_model: 32, n_head: 4, ffn: 64, vocab: 256,"
                           " seq_len: 16}\n"
                        << "data: {dataset_dir: " << dir_ << "/data}\n"
                        << "schedule: {total_steps: " << steps << ", warmup_steps: 2}\n"
                        << "batch: {micro_batch: 4, global_batch: 8}\n"
                        << "checkpoint: {every_steps: " << every << ", keep_last: 50}\n"
                        << "eval: {every_steps: 0, batches: 2}\n"
                        << "train: {backend: cpu, log_every: 1, workers: 2, max_restarts: 2}\n"
                        << extra;
    return path;
  }

  // The run id from `forgectl submit` output ("submitted ID (STATE)").
  static std::string RunId(const ShellResult& r) {
    const std::string key = "submitted ";
    const size_t at = r.output.find(key);
    if (at == std::string::npos) return "";
    const size_t end = r.output.find(' ', at + key.size());
    return r.output.substr(at + key.size(), end - at - key.size());
  }

  // `forgectl status RUN --json` field (a crude scan: "key":value).
  std::string StatusField(const std::string& run, const std::string& key) const {
    ShellResult r = Ctl("--json status " + run);
    const std::string k = "\"" + key + "\":";
    const size_t at = r.output.find(k);
    if (at == std::string::npos) return "";
    size_t b = at + k.size(), e = b;
    if (r.output[b] == '"') {
      e = r.output.find('"', b + 1);
      return r.output.substr(b + 1, e - b - 1);
    }
    while (e < r.output.size() && r.output[e] != ',' && r.output[e] != '}') ++e;
    return r.output.substr(b, e - b);
  }
  int64_t Step(const std::string& run) const {
    const std::string s = StatusField(run, "step");
    return s.empty() ? 0 : std::atoll(s.c_str());
  }

 private:
  std::string dir_, address_;
  Process coordinator_;
  std::vector<Process> workers_;
  int coordinator_starts_ = 0;
};

}  // namespace forge::test
