// `forge`: the local command-line entry point.
//   forge train CONFIG [--steps N] [--backend auto|cpu|cuda] [--run-dir DIR]
//                      [--resume latest|step_N|PATH] [--checkpoint-every N] [--direct]
//     Launched alone, it starts an in-process coordinator (state, address and a user token in
//     <run_dir>/coordinator, so forgectl can watch) and one local worker that trains the run
//     (cli/local_launch.h); --direct trains without them.
//     Under `mpirun -np N` (or `srun --mpi=pmix`) the N processes train one model
//     data-parallel in parallel.mode (CPU backend); rank 0 prints and writes metrics.
//     --resume overrides checkpoint.resume, --checkpoint-every checkpoint.every_steps.
//     SIGINT, SIGTERM or SIGUSR1 (Ctrl-C, scancel, sbatch --signal) save a checkpoint at the
//     next step boundary and end the run cleanly (exit 0); a second signal kills at once. Under Open MPI's mpirun signal the ranks, or
//     mpirun with SIGUSR1 (which it forwards): on SIGTERM/SIGINT mpirun kills them itself.
//   forge export | import | generate | eval ...
//     What one does with a trained model (cli/model_commands.h; each command's --help).
//   forge data prepare | inspect | baseline | tokenize ...
//   forge plan CONFIG --gpus N [--gpus-per-node G] [--link nvlink|ib400|eth100]
//     Predicted speed and memory of each parallel mode on N GPUs (cli/plan_command.h).
//   forge has-gpu
// Every command's flags are declared with common/flags.h: `forge --help` lists the commands,
// `forge COMMAND --help` a command's flags; --version anywhere prints the version.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/data_commands.h"
#include "cli/local_launch.h"
#include "cli/model_commands.h"
#include "cli/plan_command.h"
#include "common/config.h"
#include "common/flags.h"
#include "metrics/train_metrics.h"
#include "worker/data/dataset.h"
#include "worker/parallel/bootstrap.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/mpi_comm.h"
#include "worker/run/process_run.h"
#include "worker/train/backend.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

int Fail(const Status& s) {
  std::fprintf(stderr, "forge: %s\n", s.ToString().c_str());
  return 1;
}

// `forge` itself: its commands, --help and --version.
FlagParser TopFlags() {
  return FlagParser(
      "forge", "COMMAND",
      "commands (forge COMMAND --help for each one's flags):\n"
      "  train CONFIG     train the model CONFIG describes\n"
      "  export           a checkpoint as safetensors or a Hugging Face Llama directory\n"
      "  import HF_DIR    a Hugging Face Llama directory as a Forge checkpoint\n"
      "  generate         complete prompts with a model\n"
      "  eval             loss, perplexity, bits per byte, multiple-choice accuracy\n"
      "  data COMMAND     prepare, inspect, baseline, tokenize\n"
      "  plan CONFIG      predict speed and memory of each parallel mode on N GPUs\n"
      "  has-gpu          yes (exit 0) when a CUDA device is usable, no (exit 1) otherwise");
}

int HasGpu(int argc, char** argv) {
  FlagParser flags("forge has-gpu", "",
                   "Prints yes (exit 0) when a CUDA device is usable, no (exit 1) otherwise.");
  if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
  const bool gpu = CudaDeviceAvailable();
  std::printf("%s\n", gpu ? "yes" : "no");
  return gpu ? 0 : 1;
}

// Set by SIGINT/SIGTERM/SIGUSR1; the trainer checkpoints at the next step boundary and returns. The
// handler then restores the default action, so a second signal ends the process at once.
std::atomic<bool> g_stop_requested{false};

extern "C" void OnStopSignal(int sig) {
  g_stop_requested.store(true);
  std::signal(sig, SIG_DFL);
}

void InstallStopHandlers() {
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  std::signal(SIGUSR1, OnStopSignal);
}

// The closing line of `forge train` (rank 0): how the run ended, its losses and metrics file.
int ReportTrain(const ProcessRunResult& run, bool leader) {
  const std::string& metrics_path = run.metrics_path;
  const UnigramBaseline base{run.unigram_baseline};
  const TrainResult* r = &run.train;
  if (leader && r->stopped) {
    const std::string saved = r->checkpoints.empty()
                                  ? "nothing new to save"
                                  : "checkpoint step_" + std::to_string(r->checkpoints.back());
    std::printf("forge: stopped on a signal after step %ld (%s); continue with --resume latest "
                "| metrics %s\n",
                long(r->steps), saved.c_str(), metrics_path.c_str());
  } else if (leader) {
    std::printf("forge: done: %ld steps", long(r->steps));
    if (!r->resumed_from.empty())
      std::printf(" (%ld after resuming at step %ld)", long(r->steps - r->resumed_step),
                  long(r->resumed_step));
    if (r->steps > r->resumed_step)
      std::printf(" in %.1f s, %.0f tokens/s | train loss %.4f", r->seconds, r->tokens_per_s,
                  r->final_train_loss);
    // The loss before the first step is not known where the workers trained in processes of
    // their own (their logs' "step 0/N" line has it).
    std::printf(" | val loss ");
    if (r->initial_val_loss >= 0) std::printf("%.4f -> ", r->initial_val_loss);
    std::printf("%.4f", r->final_val_loss);
    if (base.val_cross_entropy > 0) std::printf(" (unigram baseline %.4f)", base.val_cross_entropy);
    if (r->loss_spikes > 0)
      std::printf(" | %ld loss spike(s) skipped, %ld rollback(s)", long(r->loss_spikes),
                  long(r->spike_rollbacks));
    std::printf(" | metrics %s\n", metrics_path.c_str());
  }
  return 0;
}

FlagParser TrainFlags() {
  FlagParser f("forge train", "CONFIG",
               "Trains the model CONFIG describes: alone, through an in-process coordinator and a "
               "local worker;\nunder mpirun/srun (or with --direct), directly in these processes.");
  f.Value("--steps", "N", "stop after N optimizer steps (the schedule keeps schedule.total_steps)");
  f.Value("--backend", "auto|cpu|cuda", "overrides train.backend");
  f.Value("--run-dir", "DIR", "overrides train.run_dir");
  f.Value("--resume", "latest|step_N|PATH", "overrides checkpoint.resume");
  f.Value("--checkpoint-every", "N", "overrides checkpoint.every_steps");
  f.Bool("--direct", "train in this process, without a coordinator");
  f.Bool("--print-config", "print the resolved config (YAML) and exit");
  f.Positional(1);
  return f;
}

int Train(const FlagParser& a, ProcessGroup* group) {
  auto loaded = LoadRunConfig(a.positional()[0]);
  if (!loaded.ok()) return Fail(loaded.status());
  RunConfig cfg = std::move(loaded).value();
  if (a.Has("--backend")) {
    const std::string b = a.Get("--backend");
    if (b == "cpu") cfg.train.backend = Backend::kCpu;
    else if (b == "cuda") cfg.train.backend = Backend::kCuda;
    else if (b == "auto") cfg.train.backend = Backend::kAuto;
    else return Fail(Status::Invalid("--backend: expected auto, cpu or cuda, got " + b));
  }
  if (a.Has("--run-dir")) cfg.train.run_dir = a.Get("--run-dir");
  if (a.Has("--resume")) cfg.checkpoint.resume = a.Get("--resume");
  if (a.Has("--checkpoint-every")) {
    const std::string n = a.Get("--checkpoint-every");
    char* end = nullptr;
    const long long every = std::strtoll(n.c_str(), &end, 10);
    if (n.empty() || *end != '\0' || every < 0)
      return Fail(Status::Invalid("--checkpoint-every: expected a step count >= 0, got " + n));
    cfg.checkpoint.every_steps = every;
  }
  if (a.Has("--print-config")) {  // the resolved config, as the run would use it
    std::fputs(RunConfigToYaml(cfg).c_str(), stdout);
    return 0;
  }
  TrainOptions opt;
  opt.stop_requested = &g_stop_requested;
  if (Status s = a.GetInt("--steps", &opt.max_steps); !s.ok()) return Fail(s);

  // Launched alone (no mpirun / srun / torchrun variables): through an in-process coordinator
  // and a local worker (cli/local_launch.h), as on a cluster. --direct trains right here.
  auto launch = DetectLaunch();
  if (!launch.ok()) return Fail(launch.status());
  if (launch->kind == LaunchKind::kSingle && !a.Has("--direct")) {
    // /metrics come from the in-process worker once placed: labelled with the coordinator's
    // run id and the run's world size, as the other GPUs' forge-workers label theirs.
    InstallStopHandlers();
    auto local = cli::TrainWithLocalCoordinator(cfg, opt);
    if (!local.ok()) return Fail(local.status());
    return ReportTrain(*local, true);
  }
  // /metrics when metrics.port is set: a series per step record (and, under MPI, collective
  // wait times), on port + local rank. No coordinator here: the run's id is its name.
  auto metrics = TrainMetrics::Start(cfg, cfg.name, launch->rank, launch->local_rank,
                                     launch->world);
  if (!metrics.ok()) return Fail(metrics.status());
  if (*metrics) opt.on_step = (*metrics)->StepCallback(opt.on_step);
  auto finish = [&](const StatusOr<ProcessRunResult>& run) {
    if (*metrics)
      (*metrics)->Finish(!run.ok() ? "failed" : run->train.stopped ? "stopped" : "completed");
  };

  auto joined = JoinProcessGroup(cfg);
  if (!joined.ok()) return Fail(joined.status());
  *group = std::move(joined).value();
  if (*metrics) group->comm = (*metrics)->TimeCollectives(std::move(group->comm));
  // The backend's NCCL collectives, timed with CUDA events (comm_time_sink.h).
  CommTimeCounter nccl_times(*metrics ? &(*metrics)->worker() : nullptr, nullptr);
  if (*metrics && group->nccl) group->nccl->SetTimeSink(&nccl_times);
  const bool leader = group->rank() == 0;
  InstallStopHandlers();
  auto run = TrainInProcessGroup(cfg, group, opt);
  if (group->nccl) group->nccl->SetTimeSink(nullptr);  // nccl_times ends before the group
  finish(run);
  if (!run.ok()) return Fail(run.status());
  return ReportTrain(*run, leader);
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  const std::string cmd = argc >= 2 ? argv[1] : "";
  if (cmd.empty() || cmd == "help") {
    std::fputs(TopFlags().Usage().c_str(), cmd.empty() ? stderr : stdout);
    return cmd.empty() ? 2 : 0;
  }
  if (cmd[0] == '-') {  // forge --help, forge --version
    FlagParser top = TopFlags();
    if (int rc; top.ParseOrExit(2, argv, 1, &rc)) return rc;
  }
  if (cmd == "has-gpu") return HasGpu(argc, argv);
  if (cmd == "train") {
    FlagParser flags = TrainFlags();
    if (int rc; flags.ParseOrExit(argc, argv, 2, &rc)) return rc;
    ProcessGroup group;
    const int rc = Train(flags, &group);
    // A rank that failed alone would leave the others blocked in their next collective.
    if (rc != 0 && group.comm && group.world() > 1)
      group.comm->Abort(Status::Internal("rank " + std::to_string(group.rank()) + " failed"));
    group.comm.reset();
    FinalizeMpi();
    return rc;
  }
  if (cmd == "export") return RunExportCommand(argc, argv);
  if (cmd == "import") return RunImportCommand(argc, argv);
  if (cmd == "generate") return RunGenerateCommand(argc, argv);
  if (cmd == "eval") return RunEvalCommand(argc, argv);
  if (cmd == "data") return RunDataCommand(argc, argv);
  if (cmd == "plan") return RunPlanCommand(argc, argv);
  const Status unknown = UnknownCommand(
      cmd, {"train", "export", "import", "generate", "eval", "data", "plan", "has-gpu"});
  return UsageError("forge", unknown);
}
