// Chaos soak under the real one-node Slurm (slurm_fixture.h): deploy/slurm/forge-train.sbatch
// runs a CPU run on 4 workers while a seeded chaos driver, for a fixed number of rounds, does
// one fault per round, each kind equally often in a seeded order:
//   kill_worker       kill -9 of a random forge-worker of the job
//   stop_worker       SIGSTOP of a random forge-worker (caught: no heartbeat, then hang)
//   kill_coordinator  kill -9 of the job's forge-coordinator (the job starts it again)
//   fill_checkpoint_fs  the file system holding the checkpoints (a 256 MiB tmpfs mounted on the
//                     runs dir) filled to the last byte until a save fails and the run
//                     restarts; where mounting is not allowed, a 1 KiB file-size limit
//                     (RLIMIT_FSIZE, prlimit) on a random rank > 0, whose next shard write
//                     then fails
// Between faults the run must commit a new checkpoint. Then the run must finish, and:
//   - no committed step lost: every checkpoint the coordinator announced as committed is on
//     disk and loads, and every placement after a fault resumed the newest one committed;
//   - every segment between two resume points, and the last one to the end, is bitwise an
//     unfailed `mpirun -np 4 forge train` resumed from the same checkpoint (same data cursor).
// It prints one JSON line: rounds survived, faults of each kind, committed steps lost, time to
// recover (fault -> the run training past the step it had reached) p50/max, restarts.
#include <gtest/gtest.h>
#include <signal.h>
#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <regex>
#include <vector>

#include "slurm_fixture.h"
#include "worker/checkpoint/checkpoint.h"
#include "mpi_launch.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using test::Contains;
using test::ReadFile;
using test::Shell;
using test::ShellResult;

constexpr int kRounds = 8;          // 2 of each kind
constexpr uint32_t kSeed = 36013;   // the fault order and victims
constexpr int kTotalSteps = 200;

class SlurmChaos : public test::SlurmFixture {
 protected:
  void SetUp() override {
    test::SlurmFixture::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    runs_ = dir_ + "/state/runs";
    fs::create_directories(runs_);
    tmpfs_ = Shell("mount -t tmpfs -o size=256m forge-chaos " + runs_).exit_code == 0;
  }
  void TearDown() override {
    if (tmpfs_) Shell("umount -l " + runs_);
    test::SlurmFixture::TearDown();
  }

  std::string Ctl(const std::string& args) {
    std::string addr = ReadFile(dir_ + "/state/slurm/coordinator-" + job_ + ".address");
    while (!addr.empty() && addr.back() == '\n') addr.pop_back();
    return Run(test::Bin("forgectl") + " --coordinator " + addr +
               " --token-file " + dir_ + "/state/secrets/token " + args);
  }
  // A field of `forgectl --json status` ("" when the coordinator does not answer).
  static std::string Field(const std::string& json, const std::string& key) {
    std::smatch m;
    if (!std::regex_search(json, m, std::regex("\"" + key + "\":\"?([^\",}]*)"))) return "";
    return m[1].str();
  }
  struct Status {
    std::string state;
    int64_t step = -1, checkpoint = -1;
    int attempt = -1;
  };
  Status Poll(const std::string& run) {
    const std::string j = Ctl("--json status " + run);
    Status s;
    s.state = Field(j, "state");
    if (s.state.empty()) return s;
    s.step = std::atoll(Field(j, "step").c_str());
    s.checkpoint = std::atoll(Field(j, "latest_checkpoint_step").c_str());
    s.attempt = std::atoi(Field(j, "attempt").c_str());
    return s;
  }

  // An environment variable of process `pid` as a number (-1 when unset).
  static long EnvNumber(const std::string& env, const std::string& key) {
    const size_t at = env.find('\0' + key + "=");
    return at == std::string::npos ? -1 : std::atol(env.c_str() + at + key.size() + 2);
  }
  // This job's processes running the program `name`, with their SLURM_PROCID (-1 when not a
  // task); for tasks, only those of the newest step (a failed step's workers can linger until
  // the coordinator aborts them). By the kernel's name of the process (15 characters at most),
  // not the task shells whose command lines name the program too.
  std::vector<std::pair<long, int>> JobProcesses(const std::string& name) {
    std::vector<std::pair<long, int>> out;
    std::vector<long> steps;
    std::istringstream pids(Run("pgrep -f " + name));
    for (long pid; pids >> pid;) {
      std::string comm = ReadFile("/proc/" + std::to_string(pid) + "/comm");
      while (!comm.empty() && comm.back() == '\n') comm.pop_back();
      if (comm != name.substr(0, 15)) continue;
      const std::string env = '\0' + ReadFile("/proc/" + std::to_string(pid) + "/environ");
      if (EnvNumber(env, "SLURM_JOB_ID") != std::atol(job_.c_str())) continue;
      out.emplace_back(pid, int(EnvNumber(env, "SLURM_PROCID")));
      steps.push_back(EnvNumber(env, "SLURM_STEP_ID"));
    }
    if (steps.empty()) return out;
    const long newest = *std::max_element(steps.begin(), steps.end());
    std::vector<std::pair<long, int>> kept;
    for (size_t i = 0; i < out.size(); ++i)
      if (steps[i] == newest) kept.push_back(out[i]);
    return kept;
  }

  // Fills the tmpfs to the last page (writes until ENOSPC); returns the filler's path ("" when
  // nothing could be written).
  std::string Fill() {
    const std::string path = runs_ + "/.chaos-filler";
    const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_APPEND, 0600);
    if (fd < 0) return "";
    std::vector<char> block(1 << 20, 'x');
    int64_t written = 0;
    for (size_t size = block.size(); size >= 4096;) {
      const ssize_t n = ::write(fd, block.data(), size);
      if (n > 0) written += n;
      if (n < ssize_t(size)) size /= 2;  // full at this size: finish with smaller blocks
    }
    ::close(fd);
    return written > 0 ? path : "";
  }

  std::string runs_, job_;
  bool tmpfs_ = false;
};

// Weights of a committed checkpoint, every unit concatenated (empty when it does not load).
std::vector<float> Weights(const std::string& dir, std::string* error = nullptr) {
  auto ck = LoadFullCheckpoint(dir);
  std::vector<float> all;
  if (!ck.ok()) {
    if (error) *error = ck.status().ToString();
    return all;
  }
  for (const auto& u : ck->master) all.insert(all.end(), u.begin(), u.end());
  return all;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[size_t(std::min<double>(v.size() - 1, p * double(v.size() - 1) + 0.5))];
}

TEST_F(SlurmChaos, FourWorkersSurviveSeededFaultsBitwise) {
  ::setenv("FORGE_WORKER_ARGS", "--throttle-ms 100", 1);
  // 4 s: how long a silent worker (kill -9, SIGSTOP) takes to be noticed; a restarted
  // coordinator gives the workers it knows twice that to reconnect.
  ::setenv("FORGE_HEARTBEAT_TIMEOUT_MS", "4000", 1);
  const std::string cfg = dir_ + "/chaos.yaml";
  {
    std::ofstream y(cfg);
    y << "name: chaos\nseed: 5\n"
      << "model: {n_layer: 2, d_model: 32, n_head: 4, n_kv_head: 2, ffn: 64, vocab: 256, "
         "seq_len: 16}\n"
      << "data: {dataset_dir: " << dir_ << "/data}\n"
      << "schedule: {total_steps: " << kTotalSteps << ", warmup_steps: 2}\n"
      << "batch: {micro_batch: 2, global_batch: 8}\n"
      << "parallel: {mode: zero2, collective_timeout_s: 60}\n"
      << "checkpoint: {every_steps: 4, keep_last: 1000}\n"
      << "eval: {every_steps: 0, batches: 2}\n"
      << "train: {backend: cpu, log_every: 1, workers: 4, max_restarts: 40, hang_timeout_s: 8, "
         "run_dir: " << dir_ << "/runs/chaos}\n";
  }
  job_ = Submit(cfg);
  ASSERT_FALSE(job_.empty());
  ASSERT_TRUE(WaitFor(60, [&] { return !RunIdOf("chaos").empty(); })) << JobLog(job_);
  const std::string run = RunIdOf("chaos");
  const std::string ckpts = runs_ + "/" + run + "/checkpoints/";

  std::mt19937 rng(kSeed);
  std::vector<std::string> kinds;
  for (int i = 0; i < kRounds; ++i)
    kinds.push_back(i % 4 == 0   ? "kill_worker"
                    : i % 4 == 1 ? "stop_worker"
                    : i % 4 == 2 ? "kill_coordinator"
                                 : "fill_checkpoint_fs");
  std::shuffle(kinds.begin(), kinds.end(), rng);

  std::map<std::string, int> faults;
  std::vector<double> recover_s;
  int survived = 0;
  int64_t ck_at_fault = -1;
  for (int round = 0; round < kRounds; ++round) {
    const std::string kind = kinds[size_t(round)];
    // Healthy first: running, and a checkpoint committed since the last fault.
    Status s;
    ASSERT_TRUE(WaitFor(120, [&] {
      s = Poll(run);
      return s.state == "RUNNING" && s.checkpoint > ck_at_fault && s.step > s.checkpoint;
    })) << "round " << round << " (" << kind << "): no progress\n" << JobLog(job_);
    ASSERT_LT(s.step, kTotalSteps - 30) << "the run outran the chaos: raise kTotalSteps";
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 800));
    // The fault goes into a running step: the placement may have ended meanwhile (its
    // workers exit and the job relaunches the step), then it waits for the next one.
    std::vector<std::pair<long, int>> workers;
    ASSERT_TRUE(WaitFor(120, [&] {
      s = Poll(run);
      workers = JobProcesses("forge-worker");
      return s.state == "RUNNING" && !workers.empty();
    })) << "round " << round << " (" << kind << "): no running step\n" << JobLog(job_)
        << Run("ps -ef");
    ck_at_fault = s.checkpoint;
    const auto t0 = std::chrono::steady_clock::now();
    long stopped = 0;
    std::string filler;
    const auto victim = workers[rng() % workers.size()];
    if (kind == "kill_worker") {
      ::kill(pid_t(victim.first), SIGKILL);
      Log("round %d: kill -9 forge-worker %ld (rank %d) at step %ld\n", round, victim.first,
          victim.second, long(s.step));
    } else if (kind == "stop_worker") {
      stopped = victim.first;
      ::kill(pid_t(stopped), SIGSTOP);
      Log("round %d: SIGSTOP forge-worker %ld (rank %d) at step %ld\n", round, stopped,
          victim.second, long(s.step));
    } else if (kind == "kill_coordinator") {
      const auto coords = JobProcesses("forge-coordinator");
      ASSERT_EQ(coords.size(), 1u) << Run("ps -ef");
      ::kill(pid_t(coords[0].first), SIGKILL);
      Log("round %d: kill -9 forge-coordinator %ld at step %ld\n", round, coords[0].first,
          long(s.step));
    } else if (tmpfs_) {
      filler = Fill();
      ASSERT_FALSE(filler.empty()) << "cannot fill " << runs_;
      Log("round %d: filled the checkpoint tmpfs at step %ld\n", round, long(s.step));
    } else {
      long writer = 0;
      for (const auto& [pid, rank] : workers)
        if (rank > 0) writer = pid;
      ASSERT_NE(writer, 0);
      Run("prlimit --pid " + std::to_string(writer) + " --fsize=1024:1024");
      Log("round %d: RLIMIT_FSIZE 1 KiB on forge-worker %ld at step %ld\n", round, writer,
          long(s.step));
    }
    ++faults[kind];
    // Recovered: training again past the step it had reached (after a restart, from the
    // newest committed checkpoint).
    const bool restarts = kind != "kill_coordinator";
    bool recovered = WaitFor(120, [&] {
      const Status now = Poll(run);
      if (!filler.empty() && (now.attempt > s.attempt || now.state == "RESTARTING")) {
        fs::remove(filler);  // a save failed and the run restarts: room again
        filler.clear();
      }
      return now.state == "RUNNING" && now.step > s.step &&
             (!restarts || now.attempt > s.attempt);
    });
    if (!filler.empty()) fs::remove(filler);
    if (stopped != 0) ::kill(pid_t(stopped), SIGCONT);  // if the step's end left it
    ASSERT_TRUE(recovered) << "round " << round << " (" << kind << ") not recovered\n"
                           << JobLog(job_);
    recover_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    Log("round %d: %s recovered in %.1f s\n", round, kind.c_str(), recover_s.back());
    ++survived;
  }

  const auto [state, log] = AwaitJob(job_);
  ASSERT_EQ(state, "COMPLETED") << log;
  ASSERT_TRUE(Contains(log, "run " + run + ": COMPLETED at step " + std::to_string(kTotalSteps)))
      << log;

  // What the coordinator announced, in order (the job's `forgectl watch`).
  std::set<int64_t> committed;
  std::vector<int64_t> resumes;  // each placement's checkpoint (0: the fresh start)
  int64_t lost = 0;
  int placements = 0;
  std::istringstream lines(log);
  const std::regex commit_re("checkpoint step_([0-9]+) committed");
  const std::regex place_re("attempt ([0-9]+) placed on [0-9]+ worker\\(s\\) .* from (step_([0-9]+)|a fresh start)");
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, commit_re)) committed.insert(std::atoll(m[1].str().c_str()));
    if (std::regex_search(line, m, place_re)) {
      const int64_t from = m[3].matched ? std::atoll(m[3].str().c_str()) : 0;
      const int64_t newest = committed.empty() ? 0 : *committed.rbegin();
      if (from != newest) {
        ADD_FAILURE() << "attempt " << m[1] << " resumed step_" << from << ", not the newest "
                      << "committed step_" << newest;
        ++lost;
      }
      resumes.push_back(from);
      ++placements;
    }
  }
  ASSERT_FALSE(committed.empty()) << log;
  EXPECT_EQ(*committed.rbegin(), kTotalSteps);
  for (int64_t step : committed) {
    std::string error;
    if (Weights(ckpts + "step_" + std::to_string(step), &error).empty()) {
      ADD_FAILURE() << "committed step_" << step << " does not load: " << error;
      ++lost;
    }
  }

  // Each segment against an unfailed 4-rank run from the same checkpoint.
  resumes.erase(std::unique(resumes.begin(), resumes.end()), resumes.end());
  resumes.push_back(kTotalSteps);
  int segments_bitwise = 0;
  for (size_t i = 0; i + 1 < resumes.size(); ++i) {
    const int64_t from = resumes[i], to = resumes[i + 1];
    if (to <= from) continue;
    const std::string ref = dir_ + "/reference-" + std::to_string(i);
    const std::string resume = from == 0 ? "" : " --resume " + ckpts + "step_" + std::to_string(from);
    ShellResult r = Shell(test::Mpirun(4) + test::Bin("forge") + " train " + cfg +
                          " --run-dir " + ref + resume + " --steps " + std::to_string(to));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<float> got = Weights(ckpts + "step_" + std::to_string(to));
    const std::vector<float> want = Weights(ref + "/checkpoints/step_" + std::to_string(to));
    const bool same = !got.empty() && got.size() == want.size() &&
                      std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0;
    EXPECT_TRUE(same) << "step_" << to << " differs from an unfailed run resumed at step_"
                      << from;
    segments_bitwise += same;
    fs::remove_all(ref);
  }

  std::printf(
      "{\"chaos_soak\":{\"seed\":%u,\"rounds\":%d,\"rounds_survived\":%d,\"faults\":{"
      "\"kill_worker\":%d,\"stop_worker\":%d,\"kill_coordinator\":%d,\"fill_checkpoint_fs\":%d},"
      "\"fill_mode\":\"%s\",\"committed_checkpoints\":%zu,\"committed_steps_lost\":%ld,"
      "\"segments_bitwise\":%d,\"segments\":%zu,\"recover_s\":{\"p50\":%.1f,\"max\":%.1f},"
      "\"placements\":%d,\"steps\":%d}}\n",
      kSeed, kRounds, survived, faults["kill_worker"], faults["stop_worker"],
      faults["kill_coordinator"], faults["fill_checkpoint_fs"], tmpfs_ ? "tmpfs" : "rlimit_fsize",
      committed.size(), long(lost), segments_bitwise, resumes.size() - 1,
      Percentile(recover_s, 0.5),
      recover_s.empty() ? 0.0 : *std::max_element(recover_s.begin(), recover_s.end()), placements,
      kTotalSteps);
  EXPECT_EQ(survived, kRounds);
  EXPECT_EQ(lost, 0);
}

}  // namespace
}  // namespace forge
