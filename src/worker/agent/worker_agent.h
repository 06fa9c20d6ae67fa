// The worker agent (forge-worker, and the local workers of `forge train`): joins the
// coordinator's pool, waits for a placement, trains it with the engine (TrainInProcessGroup:
// the CPU backend over MpiComm under mpirun, as `forge train` does), heartbeats its step
// metrics and obeys the answer (continue, checkpoint, stop, abort), hands checkpoint shards to
// the coordinator for commit, reports how the placement ended, and joins again for more work.
//
// Launched by mpirun / srun --mpi=pmix, the processes form one launch group (rank 0 picks a
// group id and broadcasts it); the coordinator places them together. ABORT (the run lost a
// worker, or was stopped immediately) ends the process with exit code 3: its peers may be
// blocked in a collective that cannot be unwound, and the launcher (Slurm, a StatefulSet,
// `forge train`) brings a fresh worker back.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "worker/agent/coordinator_link.h"
#include "common/config.h"
#include "common/status.h"
#include "worker/run/process_run.h"

namespace forge::agent {

struct AgentOptions {
  LinkOptions link;
  std::string device;        // "" = auto: cuda:<local rank> where a GPU is visible, else cpu
  int max_placements = -1;   // > 0: exit after this many placements ended (tests, local runs)
  int throttle_ms = 0;       // sleep after each logged step (demos and tests of tiny runs)
  bool print_progress = true;  // rank 0 prints the trainer's progress lines
  std::atomic<bool>* quit = nullptr;  // set: stop joining (local launcher shutdown)
  bool announce = true;      // print a line per placement (off under `forge train`)
  // Serve /metrics (the run config's metrics.port + local rank) while a placement trains,
  // labelled with the coordinator's run id and the placement's rank and world (`forge train`'s
  // in-process worker too: so every rank of a local run agrees).
  bool serve_metrics = true;
  // In-process use (`forge train`): a stop flag shared with the caller's signal handler (the
  // coordinator's STOP sets it too), a step limit, a step callback, and each placement's
  // outcome as the engine returned it.
  std::atomic<bool>* stop_flag = nullptr;
  int64_t max_steps = -1;
  std::function<void(const StepRecord&)> on_step;
  std::function<void(const StatusOr<ProcessRunResult>&)> on_result;
  // Called once, after this worker's first Join was answered (it is in the pool from then on).
  std::function<void()> on_joined;
};

// Runs until max_placements, quit, or an unrecoverable error. Returns the process exit code.
int RunWorkerAgent(const AgentOptions& options);

}  // namespace forge::agent
