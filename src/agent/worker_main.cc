// forge-worker: a worker process of the coordinator's pool.
//   forge-worker --coordinator HOST:PORT [--join-secret-file FILE] [--tls-ca FILE]
//                [--device cpu|cuda:N] [--max-placements N] [--throttle-ms N]
//                [--give-up-after-s S] [--max-steps N]
// The join secret comes from --join-secret-file or FORGE_JOIN_SECRET, the address from
// --coordinator or FORGE_COORDINATOR. Under `mpirun -np N forge-worker ...` the N processes
// join as one launch group and train CPU data-parallel over MPI.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/worker_agent.h"
#include "rpc/auth.h"

int main(int argc, char** argv) {
  using namespace forge;
  agent::AgentOptions o;
  std::string secret_file;
  if (const char* a = std::getenv("FORGE_COORDINATOR")) o.link.channel.address = a;
  auto usage = [] {
    std::fprintf(stderr,
                 "usage: forge-worker --coordinator HOST:PORT [--join-secret-file FILE] "
                 "[--tls-ca FILE]\n"
                 "         [--device cpu|cuda:N] [--max-placements N] [--throttle-ms N] "
                 "[--give-up-after-s S] [--max-steps N]\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return usage();
    const std::string v = argv[++i];
    if (flag == "--coordinator") o.link.channel.address = v;
    else if (flag == "--join-secret-file") secret_file = v;
    else if (flag == "--tls-ca") o.link.channel.tls_ca_file = v;
    else if (flag == "--device") o.device = v;
    else if (flag == "--max-placements") o.max_placements = std::atoi(v.c_str());
    else if (flag == "--throttle-ms") o.throttle_ms = std::atoi(v.c_str());
    else if (flag == "--max-steps") o.max_steps = std::atoll(v.c_str());
    else if (flag == "--give-up-after-s") o.link.give_up_after_s = std::atof(v.c_str());
    else return usage();
  }
  if (o.link.channel.address.empty()) return usage();
  auto secret = rpc::LoadSecret(secret_file, "FORGE_JOIN_SECRET", "join secret");
  if (!secret.ok()) {
    std::fprintf(stderr, "forge-worker: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  o.link.join_secret = *secret;
  return agent::RunWorkerAgent(o);
}
