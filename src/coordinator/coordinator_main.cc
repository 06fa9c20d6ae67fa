// forge-coordinator: owns runs, places them on workers, commits checkpoints.
//   forge-coordinator --state-dir DIR [--listen HOST:PORT] [--runs-dir DIR] [--data-root DIR]...
//                     [--token-file FILE] [--join-secret-file FILE]
//                     [--tls-cert FILE --tls-key FILE]
//                     [--heartbeat-interval-ms N] [--heartbeat-timeout-ms N]
//                     [--address-file FILE] [--metrics-port N] [--metrics-bind ADDR]
// The user token comes from --token-file or FORGE_TOKEN, the workers' join secret from
// --join-secret-file or FORGE_JOIN_SECRET. --address-file receives "host:port" once listening
// (useful with port 0). Runs, and so their checkpoints, live under --runs-dir (default
// <state-dir>/runs); a spec's data.dataset_dir and data.sources dirs must lie under one of the
// --data-root dirs (repeatable; a relative one is taken under the first), and without one a
// spec may not name a dataset (workers read their own $FORGE_DATA_DIR/dataset). --metrics-port
// serves /metrics (run-level aggregates from the workers' heartbeats: total tokens/s, mean
// MFU, slowest rank's step time, worker up, run state) on --metrics-bind (default 0.0.0.0);
// 0 or absent: no /metrics. SIGTERM/SIGINT stop it; kill -9
// loses nothing (state in SQLite).
#include <pthread.h>

#include <prometheus/registry.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/file_io.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "metrics/metrics_server.h"
#include "metrics/run_aggregates.h"
#include "rpc/auth.h"

namespace {

int Fail(const forge::Status& s) {
  std::fprintf(stderr, "forge-coordinator: %s\n", s.ToString().c_str());
  return 1;
}

int Usage() {
  std::fprintf(stderr,
               "usage: forge-coordinator --state-dir DIR [--listen HOST:PORT] [--runs-dir DIR]\n"
               "         [--data-root DIR]...\n"
               "         [--token-file FILE] [--join-secret-file FILE] [--tls-cert FILE "
               "--tls-key FILE]\n"
               "         [--heartbeat-interval-ms N] [--heartbeat-timeout-ms N] "
               "[--address-file FILE]\n"
               "         [--metrics-port N] [--metrics-bind ADDR]\n");
  return 2;
}

bool ParseInt(const std::string& s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v <= 0 || v > 1 << 30) return false;
  *out = int(v);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace forge;
  coord::CoordinatorOptions copt;
  coord::ServerOptions sopt;
  std::string token_file, secret_file, address_file;
  std::string metrics_bind = "0.0.0.0";
  int metrics_port = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return Usage();
    const std::string v = argv[++i];
    if (flag == "--state-dir") copt.state_dir = v;
    else if (flag == "--runs-dir") copt.runs_dir = v;
    else if (flag == "--data-root") copt.data_roots.push_back(v);
    else if (flag == "--listen") sopt.listen = v;
    else if (flag == "--token-file") token_file = v;
    else if (flag == "--join-secret-file") secret_file = v;
    else if (flag == "--tls-cert") sopt.tls_cert_file = v;
    else if (flag == "--tls-key") sopt.tls_key_file = v;
    else if (flag == "--address-file") address_file = v;
    else if (flag == "--metrics-bind") metrics_bind = v;
    else if (flag == "--metrics-port") {
      if (v != "0" && (!ParseInt(v, &metrics_port) || metrics_port > 65535)) return Usage();
    }
    else if (flag == "--heartbeat-interval-ms") {
      if (!ParseInt(v, &copt.heartbeat_interval_ms)) return Usage();
    } else if (flag == "--heartbeat-timeout-ms") {
      if (!ParseInt(v, &copt.heartbeat_timeout_ms)) return Usage();
    } else {
      return Usage();
    }
  }
  if (copt.state_dir.empty()) return Usage();
  auto token = rpc::LoadSecret(token_file, "FORGE_TOKEN", "user token");
  if (!token.ok()) return Fail(token.status());
  auto secret = rpc::LoadSecret(secret_file, "FORGE_JOIN_SECRET", "join secret");
  if (!secret.ok()) return Fail(secret.status());
  sopt.user_token = *token;
  sopt.join_secret = *secret;

  // Block the stop signals in every thread; the main thread waits for them below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  // /metrics first, so the aggregates see the states of the runs the store reloads.
  auto registry = std::make_shared<prometheus::Registry>();
  RunAggregates aggregates(*registry);
  std::unique_ptr<MetricsServer> metrics;
  if (metrics_port > 0) {
    auto m = MetricsServer::Start(metrics_bind, metrics_port);
    if (!m.ok()) return Fail(m.status());
    metrics = std::move(m).value();
    metrics->Register(registry);
    copt.aggregates = &aggregates;
  }

  auto coordinator = coord::Coordinator::Open(copt);
  if (!coordinator.ok()) return Fail(coordinator.status());
  auto server = coord::CoordinatorServer::Start(sopt, coordinator->get());
  if (!server.ok()) return Fail(server.status());
  const std::string host = sopt.listen.substr(0, sopt.listen.rfind(':'));
  const std::string address = host + ":" + std::to_string((*server)->port());
  if (!address_file.empty()) {
    if (Status s = WriteFileAtomic(address_file, address + "\n"); !s.ok()) return Fail(s);
  }
  std::printf("forge-coordinator: listening on %s%s, state %s\n", address.c_str(),
              sopt.tls_cert_file.empty() ? "" : " (TLS)", copt.state_dir.c_str());
  if (metrics)
    std::printf("forge-coordinator: /metrics on %s:%d\n", metrics->bind_address().c_str(),
                metrics->port());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::printf("forge-coordinator: signal %d, shutting down\n", sig);
  (*coordinator)->Shutdown();
  (*server)->Shutdown();
  return 0;
}
