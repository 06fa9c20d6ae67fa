// forge-worker: a worker process of the coordinator's pool.
//   forge-worker --coordinator HOST:PORT [--join-secret-file FILE] [--tls-ca FILE]
//                [--device cpu|cuda:N] [--max-placements N] [--throttle-ms N]
//                [--give-up-after-s S] [--max-steps N] [--restart-on-abort]
// The join secret comes from --join-secret-file or FORGE_JOIN_SECRET, the address from
// --coordinator or FORGE_COORDINATOR. Under `mpirun -np N forge-worker ...` the N processes
// join as one launch group and train CPU data-parallel over MPI.
#include <cstdio>
#include <string>

#include "worker/agent/restart_on_abort.h"
#include "worker/agent/worker_agent.h"
#include "common/flags.h"
#include "rpc/connection_flags.h"
#include "worker/parallel/bootstrap.h"

namespace {

forge::FlagParser MakeFlags() {
  forge::FlagParser f(
      "forge-worker", "",
      "Joins a coordinator's pool and trains the runs placed on it. Under `mpirun -np N` the N "
      "processes\njoin as one launch group and train CPU data-parallel over MPI. The join secret "
      "comes from\n--join-secret-file or FORGE_JOIN_SECRET.");
  forge::rpc::AddCoordinatorFlags(&f);
  forge::rpc::AddSecretFlag(&f, forge::rpc::kJoinSecret);
  f.Value("--device", "cpu|cuda:N", "where to train (default cuda:<local rank> with a GPU, else cpu)");
  f.Value("--max-placements", "N", "exit after N placements ended (default: never)");
  f.Value("--throttle-ms", "N", "sleep N ms after each logged step (demos, tests of tiny runs)");
  f.Value("--give-up-after-s", "S",
          "how long a call keeps retrying an unreachable coordinator (default 300)");
  f.Value("--max-steps", "N", "stop each placement after N steps (default: the run's)");
  f.Bool("--restart-on-abort",
         "a worker the coordinator aborts (exit 3) is replaced by a fresh process at once "
         "(launched alone only; a StatefulSet then keeps its restart backoff for crashes)");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace forge;
  FlagParser flags = MakeFlags();
  if (int rc; flags.ParseOrExit(argc, argv, 1, &rc)) return rc;
  agent::AgentOptions o;
  auto channel = rpc::CoordinatorChannel(flags);
  if (!channel.ok()) return flags.UsageError(channel.status());
  o.link.channel = *channel;
  o.device = flags.Get("--device");
  for (Status s : {flags.GetInt("--max-placements", &o.max_placements),
                   flags.GetInt("--throttle-ms", &o.throttle_ms),
                   flags.GetInt("--max-steps", &o.max_steps),
                   flags.GetDouble("--give-up-after-s", &o.link.give_up_after_s)}) {
    if (!s.ok()) return flags.UsageError(s);
  }
  auto secret = rpc::LoadSecret(flags, rpc::kJoinSecret);
  if (!secret.ok()) {
    std::fprintf(stderr, "forge-worker: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  o.link.join_secret = *secret;
  if (flags.Has("--restart-on-abort")) {
    // A rank of an MPI launch cannot be replaced alone: its launcher restarts the group.
    auto launch = DetectLaunch();
    if (launch.ok() && launch->kind != LaunchKind::kMpi)
      return agent::RunRestartingOnAbort([&] { return agent::RunWorkerAgent(o); });
  }
  return agent::RunWorkerAgent(o);
}
