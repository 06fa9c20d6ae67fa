#include "cli/local_launch.h"

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "common/file_io.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "rpc/auth.h"
#include "worker/agent/worker_agent.h"
#include "worker/data/dataset.h"
#include "worker/data/run_sources.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/train/backend.h"

extern "C" char** environ;

namespace forge::cli {
namespace {

// One worker per visible GPU when the CUDA backend trains and the global batch splits over
// them; else one.
int LocalWorkers(const RunConfig& cfg) {
  const bool cuda = cfg.train.backend == Backend::kCuda ||
                    (cfg.train.backend == Backend::kAuto && CudaDeviceAvailable());
  const int gpus = cuda ? NcclVisibleDevices() : 0;
  if (gpus <= 1) return 1;
  const int64_t per_step = int64_t{cfg.batch.micro_batch} * gpus;
  if (cfg.batch.global_batch % per_step != 0) {
    std::fprintf(stderr,
                 "forge: %d GPUs visible, but batch.global_batch (%ld) is not a multiple of "
                 "micro_batch * %d: training on one GPU\n",
                 gpus, long(cfg.batch.global_batch), gpus);
    return 1;
  }
  return gpus;
}

// Environment of the worker processes: ours, with the join secret.
std::vector<std::string> WorkerEnvironment(const std::string& secret) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("FORGE_JOIN_SECRET=", 0) != 0) env.push_back(*e);
  env.push_back("FORGE_JOIN_SECRET=" + secret);
  return env;
}

// Starts `program` (a path, or a name looked up in PATH) with `args` (args[0] its name) and the
// workers' environment, in a process group of its own; 0 or the error number.
int SpawnWorkerProcess(const std::string& program, std::vector<std::string> args,
                       const std::string& secret, pid_t* pid) {
  std::vector<std::string> env = WorkerEnvironment(secret);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  const int rc = posix_spawnp(pid, program.c_str(), nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  return rc;
}

bool Terminal(v1::RunState s) {
  return s == v1::COMPLETED || s == v1::STOPPED || s == v1::FAILED;
}

v1::Run GetRunNow(coord::Coordinator* coordinator, const std::string& id) {
  v1::GetRunRequest get;
  get.set_run_id(id);
  v1::Run now;
  (void)coordinator->GetRun(get, &now);
  return now;
}

// One launch of a run's workers, in a process group of its own led by the launcher: on the CPU
// `mpirun -np N` forge-worker ranks (MPI between them); with the CUDA backend bash starting one
// forge-worker per GPU (--device cuda:I; NCCL ids relayed by the coordinator), which exits as
// soon as one of them fails (mpirun's rule: the supervisor then kills the rest). Each rank runs
// under a shell that appends "<rank> <exit status>" to exit_file when its forge-worker ends,
// however it ends (kill -9 included): the first line names the rank that was lost.
struct WorkerGroup {
  pid_t pid = -1;  // the launcher (mpirun or bash), leader of the process group
  std::string launcher;
  std::string exit_file;
};

// bash's part for GPU groups: $1 the exit file, $2 the number of GPUs, then the forge-worker
// command. After each rank ends (`wait -n`) the exit file says how they ended so far: the
// first failure ends the script with its status; all n ended well, with 0.
constexpr char kGpuGroupScript[] =
    "f=$1; n=$2; shift 2; "
    "for ((i = 0; i < n; i++)); do "
    "  ( \"$@\" --device cuda:$i; s=$?; echo \"$i $s\" >> \"$f\"; exit $s ) & "
    "done; "
    "while :; do "
    "  wait -n; ended=0; "
    "  if [ -f \"$f\" ]; then "
    "    while read -r r s; do "
    "      [ \"$s\" = 0 ] || exit \"$s\"; ended=$((ended + 1)); "
    "    done < \"$f\"; "
    "  fi; "
    "  [ $ended -lt $n ] || exit 0; "
    "  [ -n \"$(jobs -pr)\" ] || exit 1; "
    "done";

StatusOr<WorkerGroup> SpawnWorkerGroup(bool gpus, int n, const std::string& address,
                                       const std::string& secret, int64_t max_steps,
                                       const std::string& exit_file) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string bin = (self.parent_path() / "forge-worker").string();
  if (ec || !std::filesystem::exists(bin))
    return Status::NotFound("forge-worker not found next to forge (" + bin + ")");
  std::filesystem::remove(exit_file, ec);
  WorkerGroup g;
  g.exit_file = exit_file;
  std::vector<std::string> args;
  if (gpus) {
    g.launcher = "bash";
    args = {"bash", "-c", kGpuGroupScript, "forge-gpus", exit_file, std::to_string(n)};
  } else {
    // mpirun from PATH unless FORGE_MPIRUN names one.
    const char* mpirun_env = std::getenv("FORGE_MPIRUN");
    g.launcher = mpirun_env && *mpirun_env ? mpirun_env : "mpirun";
    args = {g.launcher};
    if (::geteuid() == 0) args.push_back("--allow-run-as-root");  // the user already is root
    for (const char* a : {"--oversubscribe", "-np"}) args.push_back(a);
    args.push_back(std::to_string(n));
    for (const char* a : {"/bin/sh", "-c",
                          "f=$1; shift; \"$@\"; s=$?; "
                          "echo \"${OMPI_COMM_WORLD_RANK:-?} $s\" >> \"$f\"; exit $s",
                          "forge-rank"})
      args.push_back(a);
    args.push_back(exit_file);
  }
  for (const std::string& a : {bin, std::string("--coordinator"), address,
                               std::string("--max-placements"), std::string("1"),
                               std::string("--give-up-after-s"), std::string("30")})
    args.push_back(a);
  if (max_steps >= 0) {
    args.push_back("--max-steps");
    args.push_back(std::to_string(max_steps));
  }
  // More forge-worker flags, split at white space, as forge-job.sh takes them (e.g.
  // "--throttle-ms 50" to watch a tiny run).
  if (const char* extra = std::getenv("FORGE_WORKER_ARGS")) {
    std::istringstream words(extra);
    for (std::string w; words >> w;) args.push_back(w);
  }
  const std::string program = args.front();
  const int rc = SpawnWorkerProcess(program, std::move(args), secret, &g.pid);
  if (rc != 0)
    return Status::Unavailable(
        "cannot start " + program +
        (gpus ? std::string(" (it starts the GPUs' forge-workers)")
              : std::string(" (CPU runs of several workers train over MPI; FORGE_MPIRUN names "
                            "another mpirun)")) +
        ": " + std::strerror(rc));
  return g;
}

std::string KilledText(int signal) {
  return "was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

// "exited with status 3", "was killed by signal 9 (Killed)", from a shell's $? (128 + the
// signal for a process a signal ended).
std::string ShellExitText(int status) {
  if (status > 128) return KilledText(status - 128);
  return "exited with status " + std::to_string(status);
}

// How a group ended: the first rank that ended (its status) and mpirun's own status.
std::string DescribeGroupEnd(const WorkerGroup& g, int wait_status) {
  std::string first;
  if (std::FILE* f = std::fopen(g.exit_file.c_str(), "r")) {
    char rank[32] = {};
    int code = 0;
    if (std::fscanf(f, "%31s %d", rank, &code) == 2)
      first = std::string("rank ") + rank + " " + ShellExitText(code) + ", then ";
    std::fclose(f);
  }
  const std::string how =
      WIFSIGNALED(wait_status)
          ? KilledText(WTERMSIG(wait_status))
          : "exited with status " + std::to_string(WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1);
  return first + g.launcher + " (pid " + std::to_string(g.pid) + ") " + how;
}

void KillGroup(WorkerGroup* g) {
  if (g->pid <= 0) return;
  ::kill(-g->pid, SIGKILL);  // a stopped rank too (SIGKILL needs no SIGCONT)
  ::waitpid(g->pid, nullptr, 0);
  g->pid = -1;
}

// The launcher ended (reaped): ranks it left behind (bash leaves them to us) go too.
void KillLeftovers(WorkerGroup* g) {
  ::kill(-g->pid, SIGKILL);
  g->pid = -1;
}

// Waits up to grace_s for the group's ranks to end by themselves (they report and exit after
// the run); then the rest are killed.
void ReapGroup(WorkerGroup* g, double grace_s) {
  if (g->pid <= 0) return;
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(grace_s * 1000));
  while (::waitpid(g->pid, nullptr, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > end) {
      ::kill(g->pid, SIGKILL);
      ::waitpid(g->pid, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  KillLeftovers(g);
}

// What the run did, for the closing line: from the coordinator's records (the workers trained
// in other processes). Seconds and tokens/s count the steps' own time, as a run in one process
// does (trainer.cc), without start-up, evaluation or the time between placements. The
// coordinator keeps one record a step it heard of (a step trained again replaces its row),
// sorted by step: each record's mean step time counts over the steps since the record before
// it; where the history starts above step 1, since the newest checkpoint below it. Steps whose
// records a killed rank 0 never sent count neither in the seconds nor in the tokens.
ProcessRunResult SummaryFromCoordinator(coord::Coordinator* coordinator, const std::string& id,
                                        const RunConfig& cfg) {
  ProcessRunResult out;
  v1::GetRunHistoryRequest req;
  req.set_run_id(id);
  v1::RunHistory h;
  (void)coordinator->GetRunHistory(req, &h);
  TrainResult& t = out.train;
  t.steps = h.run().step();
  t.stopped = h.run().state() == v1::STOPPED;
  // The validation loss before step 1 rides on the records of the placement that started the
  // run fresh; a history without them (only resumed placements reported) has none.
  t.initial_val_loss = -1.0f;
  for (const v1::Checkpoint& c : h.checkpoints()) t.checkpoints.push_back(c.step());
  int64_t prev = 0, trained = 0;
  double seconds = 0;
  for (const v1::StepMetrics& m : h.steps()) {
    if (m.initial_val_loss() > 0) t.initial_val_loss = m.initial_val_loss();
    t.final_train_loss = m.loss();
    if (m.val_loss() > 0) t.final_val_loss = m.val_loss();
    if (prev == 0) {  // the first record: 1, or the first after the checkpoint resumed
      for (const int64_t c : t.checkpoints)
        if (c < m.step()) prev = std::max(prev, c);
    }
    trained += m.step() - prev;
    seconds += double(m.step() - prev) * m.step_seconds();
    prev = m.step();
  }
  t.seconds = seconds;
  t.tokens_per_s =
      seconds > 0 ? double(trained) * double(cfg.batch.global_batch) * cfg.model.seq_len / seconds
                  : 0.0;
  out.metrics_path = cfg.train.run_dir + "/metrics.jsonl";
  // The first source's unigram baseline, as a run in one process reports it: the workers of a
  // local launch read the dataset from this host's path. Left out (0) where it cannot be read.
  const std::vector<DataSourceConfig> sources = DataSources(cfg);
  if (!sources.empty()) {
    StatusOr<TokenDataset> first = TokenDataset::Open(sources.front().dir);
    if (first.ok()) out.unigram_baseline = ComputeUnigramBaseline(*first).val_cross_entropy;
  }
  return out;
}

// A world the run may shrink to from `size`: the largest w in [train.min_workers, size) whose
// micro-batches divide the global batch (the coordinator's rule); 0 when there is none.
int SmallerWorld(const RunConfig& spec, int size) {
  for (int w = size - 1; w >= MinWorkers(spec.train) && w >= 1; --w)
    if (spec.batch.global_batch % (int64_t{spec.batch.micro_batch} * w) == 0) return w;
  return 0;
}

bool Active(v1::RunState s) {
  return s == v1::RUNNING || s == v1::CHECKPOINTING;
}

// One launch group under supervision and what the coordinator did with it.
struct SupervisedGroup {
  WorkerGroup group;
  int size = 0;
  int launched_attempt = 0;  // the run's attempt when it was launched
  int placed_attempt = 0;    // the attempt placed on it (0: not placed yet)
  int64_t checkpoint_at_launch = -1;
  bool Live() const { return group.pid > 0; }
};

// A run of several workers: this process only coordinates and supervises. Each launch is one
// WorkerGroup (CPU ranks under mpirun, or one forge-worker per GPU); when its processes end
// while the run is still placed on them (a rank killed or crashed), the coordinator hears it at once and restarts the run from its last
// committed checkpoint, and a fresh group is launched after a backoff (1 s, doubling, at most
// 30 s; back to 1 s after a group that got the run a new checkpoint). When the coordinator
// restarts the run itself (a hang, a heartbeat timeout) the group is killed and replaced the
// same way. The coordinator bounds the restarts by train.max_restarts; a group that ends before
// the run is ever placed on it counts against the same bound here.
//
// Elastic (train.min_workers < train.workers): a group that ends without the run gaining a
// checkpoint since it was launched (it could not start, or fails at once again) is replaced by
// a smaller one, the largest world down to min_workers that divides the global batch, and the
// coordinator continues the run on it past train.elastic_grace_s. While the run trains on
// fewer workers, a group of the full size is launched beside it (after the same backoff,
// retried with it while it fails); once its workers join, the coordinator stops the smaller
// world at a checkpoint and grows the run back onto them. CPU groups only: a GPU group is
// launched whole, on every GPU, each time.
StatusOr<ProcessRunResult> SuperviseRun(coord::Coordinator* coordinator, const RunConfig& spec,
                                        bool gpus, const std::string& run_id,
                                        const std::string& address, const std::string& secret,
                                        const TrainOptions& opt, const std::string& state_dir) {
  using Clock = std::chrono::steady_clock;
  const int full = spec.train.workers;
  int size = full;  // of the next main launch
  double backoff_s = 1.0, grow_backoff_s = 1.0;
  int unplaced_failures = 0, launches = 0;
  std::string last_end;  // how the last group ended
  bool stop_sent = false;
  SupervisedGroup main, grow;
  Clock::time_point launch_at = Clock::now(), grow_at = Clock::now();
  auto stop_if_asked = [&] {
    if (stop_sent || !opt.stop_requested || !opt.stop_requested->load()) return;
    stop_sent = true;
    v1::StopRunRequest stop;
    stop.set_run_id(run_id);
    v1::Run ignored;
    (void)coordinator->StopRun(stop, &ignored);  // the workers save and end
  };
  auto stop_now = [&] {
    v1::StopRunRequest stop;
    stop.set_run_id(run_id);
    stop.set_immediate(true);
    v1::Run ignored;
    (void)coordinator->StopRun(stop, &ignored);
  };
  auto after = [](double s) { return Clock::now() + std::chrono::milliseconds(int64_t(s * 1000)); };
  // Launches a group of n; the exit file is the one the other live group does not use.
  auto launch = [&](SupervisedGroup* g, int n, const SupervisedGroup& other) -> Status {
    const std::string file =
        state_dir + (other.group.exit_file == state_dir + "/workers.exit" ? "/workers.grow.exit"
                                                                          : "/workers.exit");
    const v1::Run run = GetRunNow(coordinator, run_id);
    FORGE_ASSIGN_OR_RETURN(g->group,
                           SpawnWorkerGroup(gpus, n, address, secret, opt.max_steps, file));
    g->size = n;
    g->launched_attempt = run.attempt();
    g->placed_attempt = 0;
    g->checkpoint_at_launch = run.latest_checkpoint_step();
    ++launches;
    return Status::Ok();
  };
  // Whether the run's current attempt is placed on g: the coordinator places a run only on a
  // whole launch group of exactly its world, and the two groups here differ in size.
  auto note_placement = [](SupervisedGroup* g, const v1::Run& now) {
    if (g->Live() && Active(now.state()) && now.workers() == g->size &&
        now.attempt() > g->launched_attempt)
      g->placed_attempt = now.attempt();
  };
  for (;;) {
    stop_if_asked();
    v1::Run now = GetRunNow(coordinator, run_id);
    if (Terminal(now.state())) break;

    if (!main.Live() && Clock::now() >= launch_at) {
      if (Status s = launch(&main, size, grow); !s.ok()) {
        stop_now();
        if (grow.Live()) KillGroup(&grow.group);
        return s;
      }
      if (launches > 1)
        std::fprintf(stderr, "forge: launched %d worker(s) again (%s pid %d)\n", size,
                     main.group.launcher.c_str(), int(main.group.pid));
    }
    // The full world beside a smaller one, once the run trains on that.
    if (size < full && !grow.Live() && Clock::now() >= grow_at && main.placed_attempt > 0 &&
        Active(now.state()) && now.workers() < full) {
      if (Status s = launch(&grow, full, main); !s.ok()) {
        grow_at = after(grow_backoff_s);
        grow_backoff_s = std::min(grow_backoff_s * 2, 30.0);
        std::fprintf(stderr, "forge: cannot launch %d worker(s) to grow back: %s\n", full,
                     s.ToString().c_str());
      } else {
        std::fprintf(stderr, "forge: launched %d worker(s) to grow run %s back (%s pid %d)\n",
                     full, run_id.c_str(), grow.group.launcher.c_str(), int(grow.group.pid));
      }
    }

    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop_if_asked();
    now = GetRunNow(coordinator, run_id);
    note_placement(&main, now);
    note_placement(&grow, now);

    // The run grew back onto the full group: it is the main one from now on. The smaller
    // world stopped with a checkpoint; its ranks end by themselves.
    if (grow.placed_attempt > 0) {
      std::fprintf(stderr, "forge: run %s grew back to %d worker(s) (attempt %d)\n",
                   run_id.c_str(), full, grow.placed_attempt);
      if (main.Live()) {
        if (main.placed_attempt > 0) ReapGroup(&main.group, 30.0);
        else KillGroup(&main.group);
      }
      main = grow;
      grow = SupervisedGroup{};
      size = full;
      grow_backoff_s = 1.0;
      continue;
    }

    if (grow.Live()) {
      int st = 0;
      if (::waitpid(grow.group.pid, &st, WNOHANG) == grow.group.pid) {
        const std::string how = DescribeGroupEnd(grow.group, st);
        KillLeftovers(&grow.group);
        grow_at = after(grow_backoff_s);
        std::fprintf(stderr, "forge: the %d worker(s) launched to grow back ended: %s; trying "
                     "again in %g s\n", full, how.c_str(), grow_backoff_s);
        grow_backoff_s = std::min(grow_backoff_s * 2, 30.0);
      }
    }

    if (!main.Live()) continue;
    if (Terminal(now.state())) {
      // A placed group's ranks report their end and exit; others would wait on.
      if (now.state() == v1::FAILED || main.placed_attempt == 0) KillGroup(&main.group);
      else ReapGroup(&main.group, 30.0);
      break;
    }
    // The coordinator gave up the placement on this group (hang, heartbeat timeout): the ranks
    // it told to abort exit, but a stopped or blocked one may never; start over.
    if (main.placed_attempt > 0 &&
        (now.attempt() > main.placed_attempt ||
         now.state() == v1::RESTARTING || now.state() == v1::PENDING)) {
      KillGroup(&main.group);
      last_end = "killed the workers of attempt " + std::to_string(main.placed_attempt) +
                 " after the coordinator restarted it";
    } else {
      int wait_status = 0;
      if (::waitpid(main.group.pid, &wait_status, WNOHANG) != main.group.pid) continue;
      last_end = DescribeGroupEnd(main.group, wait_status);
      KillLeftovers(&main.group);
      now = GetRunNow(coordinator, run_id);
      if (Terminal(now.state())) break;
      const bool clean = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
      if (main.placed_attempt > 0 && now.attempt() == main.placed_attempt && Active(now.state())) {
        std::fprintf(stderr, "forge: workers of %s attempt %d ended: %s\n", run_id.c_str(),
                     now.attempt(), last_end.c_str());
        if (Status s = coordinator->WorkersExited(run_id, now.attempt(),
                                                  "its worker processes ended: " + last_end);
            !s.ok())
          return s;
      } else if (clean && main.placed_attempt > 0) {
        // Its placement ended well while the run goes on (it stopped to grow back, and the
        // full group was gone by then): launched again at once.
        launch_at = Clock::now();
        continue;
      } else if (main.placed_attempt == 0 && ++unplaced_failures > spec.train.max_restarts) {
        stop_now();
        if (grow.Live()) KillGroup(&grow.group);
        return Status::Unavailable("the workers ended before run " + run_id + " was placed on "
                                   "them, " + std::to_string(unplaced_failures) + " time(s) "
                                   "(train.max_restarts " +
                                   std::to_string(spec.train.max_restarts) + "): " + last_end);
      }
    }
    now = GetRunNow(coordinator, run_id);
    if (Terminal(now.state())) break;
    const bool progressed = now.latest_checkpoint_step() > main.checkpoint_at_launch;
    if (progressed) backoff_s = 1.0;  // that group got the run further: not a crash loop
    if (!progressed && main.size == size && !gpus) {
      // A group of this size cannot come back: go on with fewer where the run allows it.
      if (const int smaller = SmallerWorld(spec, size); smaller > 0) {
        std::fprintf(stderr,
                     "forge: %d worker(s) did not come back (%s): going on with %d "
                     "(train.min_workers %d); %d will be tried again beside them\n",
                     size, last_end.c_str(), smaller, MinWorkers(spec.train), full);
        size = smaller;
        grow_at = after(backoff_s);
        grow_backoff_s = backoff_s;
      }
    }
    launch_at = after(backoff_s);
    backoff_s = std::min(backoff_s * 2, 30.0);
  }
  if (main.Live()) KillGroup(&main.group);
  if (grow.Live()) KillGroup(&grow.group);  // never placed: its workers would wait on
  const v1::Run end = GetRunNow(coordinator, run_id);
  if (end.state() == v1::FAILED)
    return Status::Unavailable(
        "run " + run_id + " failed: " + end.state_reason() +
        (last_end.empty() || end.state_reason().find(last_end) != std::string::npos
             ? ""
             : " (last workers: " + last_end + ")"));
  return SummaryFromCoordinator(coordinator, run_id, spec);
}

}  // namespace

StatusOr<ProcessRunResult> TrainWithLocalCoordinator(const RunConfig& cfg,
                                                     const TrainOptions& opt) {
  const std::string state_dir = cfg.train.run_dir + "/coordinator";
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) return Status::IoError("cannot create " + state_dir + ": " + ec.message());

  coord::CoordinatorOptions co;
  co.state_dir = state_dir;
  co.local_process = true;
  FORGE_ASSIGN_OR_RETURN(auto coordinator, coord::Coordinator::Open(co));

  coord::ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.user_token = rpc::RandomSecret();
  so.join_secret = rpc::RandomSecret();
  FORGE_ASSIGN_OR_RETURN(auto server, coord::CoordinatorServer::Start(so, coordinator.get()));
  coordinator->Serving();
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(state_dir + "/token", so.user_token + "\n"));
  ::chmod((state_dir + "/token").c_str(), 0600);
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(state_dir + "/address", address + "\n"));

  // Several workers (CPU ranks under mpirun, or one per visible GPU): all in processes of their
  // own under this one's supervision, which relaunches them when they are lost. One worker:
  // in this process (nobody would bring it back, so no restarts).
  const bool cuda = cfg.train.backend == Backend::kCuda ||
                    (cfg.train.backend == Backend::kAuto && CudaDeviceAvailable());
  RunConfig spec = cfg;
  if (cuda) {
    spec.train.workers = LocalWorkers(cfg);
    // One GPU group is relaunched whole: a smaller one beside a full one would give the
    // coordinator two idle workers per GPU to combine.
    if (spec.train.workers > 1 && MinWorkers(cfg.train) < cfg.train.workers)
      std::fprintf(stderr, "forge: train.min_workers is for runs on a coordinator's pool; here "
                           "the %d GPUs' workers are relaunched together\n", spec.train.workers);
    spec.train.min_workers = 0;
  }
  const bool supervised = spec.train.workers > 1;
  if (!supervised) spec.train.max_restarts = 0;
  v1::SubmitRunRequest submit;
  submit.set_spec_yaml(RunConfigToYaml(spec));
  submit.set_source(cfg.source_path.empty() ? "<config>" : cfg.source_path);
  v1::Run run;
  if (grpc::Status s = coordinator->SubmitRun(submit, &run); !s.ok())
    return Status::Invalid(s.error_message());

  if (supervised) {
    auto supervised_result = SuperviseRun(coordinator.get(), spec, cuda, run.id(), address,
                                          so.join_secret, opt, state_dir);
    server->Shutdown();
    coordinator->Shutdown();
    return supervised_result;
  }

  agent::AgentOptions ao;
  ao.link.channel.address = address;
  ao.link.join_secret = so.join_secret;
  ao.link.give_up_after_s = 30.0;
  ao.max_placements = 1;
  ao.announce = false;
  // ao.serve_metrics stays on: this worker serves /metrics (metrics.port) with the
  // coordinator's run id, like every forge-worker.
  ao.print_progress = opt.print_progress;
  ao.stop_flag = opt.stop_requested;
  ao.max_steps = opt.max_steps;
  ao.on_step = opt.on_step;
  StatusOr<ProcessRunResult> result = Status::Internal("the local worker was never placed");
  ao.on_result = [&](const StatusOr<ProcessRunResult>& r) { result = r; };
  const int rc = agent::RunWorkerAgent(ao);
  server->Shutdown();
  coordinator->Shutdown();
  if (rc != 0 && result.ok())
    return Status::Internal("local worker exited with code " + std::to_string(rc));
  return result;
}

}  // namespace forge::cli
