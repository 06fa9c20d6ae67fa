// forge-coordinator: owns runs, places them on workers, commits checkpoints.
//   forge-coordinator --state-dir DIR [--listen HOST:PORT] [--runs-dir DIR] [--data-root DIR]...
//                     [--token-file FILE] [--join-secret-file FILE]
//                     [--tls-cert FILE --tls-key FILE]
//                     [--heartbeat-interval-ms N] [--heartbeat-timeout-ms N]
//                     [--address-file FILE] [--metrics-port N|any] [--metrics-bind ADDR]
//                     [--metrics-address-file FILE]
// The user token comes from --token-file or FORGE_TOKEN, the workers' join secret from
// --join-secret-file or FORGE_JOIN_SECRET. --address-file receives "host:port" once listening
// (useful with port 0). Runs, and so their checkpoints, live under --runs-dir (default
// <state-dir>/runs); a spec's data.dataset_dir and data.sources dirs must lie under one of the
// --data-root dirs (repeatable; a relative one is taken under the first), and without one a
// spec may not name a dataset (workers read their own $FORGE_DATA_DIR/dataset). --metrics-port
// serves /metrics (run-level aggregates from the workers' heartbeats: total tokens/s, mean
// MFU, slowest rank's step time, worker up, run state) on --metrics-bind (default 0.0.0.0);
// 0 or absent: no /metrics; `any`: a free port it picks, written as "host:port" to
// --metrics-address-file once listening (and logged). SIGTERM/SIGINT stop it; kill -9 loses
// nothing (state in SQLite).
// The flags are declared once (common/flags.h), which gives --help, --version and an error
// naming an unknown flag.
#include <pthread.h>

#include <prometheus/registry.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/file_io.h"
#include "common/flags.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "metrics/metrics_server.h"
#include "metrics/run_aggregates.h"
#include "rpc/connection_flags.h"

namespace {

int Fail(const forge::Status& s) {
  std::fprintf(stderr, "forge-coordinator: %s\n", s.ToString().c_str());
  return 1;
}

forge::FlagParser MakeFlags() {
  forge::FlagParser f(
      "forge-coordinator", "",
      "Owns runs, places them on workers and commits their checkpoints; its state lives in "
      "SQLite\nunder --state-dir (kill -9 loses nothing). SIGTERM or SIGINT stop it. The user "
      "token comes\nfrom --token-file or FORGE_TOKEN, the workers' join secret from "
      "--join-secret-file or\nFORGE_JOIN_SECRET.");
  f.Value("--state-dir", "DIR", "where the coordinator keeps its state (required)");
  f.Value("--listen", "HOST:PORT", "where to serve (default 127.0.0.1:7070; port 0: any free one)");
  f.Value("--runs-dir", "DIR", "where runs and their checkpoints live (default <state-dir>/runs)");
  f.Value("--data-root", "DIR",
          "specs' datasets must lie under one (repeatable; without: specs name none)");
  forge::rpc::AddSecretFlag(&f, forge::rpc::kUserToken);
  forge::rpc::AddSecretFlag(&f, forge::rpc::kJoinSecret);
  f.Value("--tls-cert", "FILE", "serve TLS with this certificate (with --tls-key)");
  f.Value("--tls-key", "FILE", "the private key of --tls-cert");
  f.Value("--heartbeat-interval-ms", "N", "how often workers send heartbeats (default 1000)");
  f.Value("--heartbeat-timeout-ms", "N", "a worker silent this long is lost (default 10000)");
  f.Value("--address-file", "FILE", "write host:port here once listening (useful with port 0)");
  f.Value("--metrics-port", "N|any",
          "serve /metrics (run aggregates) on this port (default 0: none; any: a free one)");
  f.Value("--metrics-address-file", "FILE",
          "write /metrics' host:port here once listening (useful with --metrics-port any)");
  f.Value("--metrics-bind", "ADDR", "the address /metrics binds (default 0.0.0.0)");
  f.Require("--state-dir");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace forge;
  FlagParser flags = MakeFlags();
  if (int rc; flags.ParseOrExit(argc, argv, 1, &rc)) return rc;
  coord::CoordinatorOptions copt;
  coord::ServerOptions sopt;
  copt.state_dir = flags.Get("--state-dir");
  copt.runs_dir = flags.Get("--runs-dir");
  copt.data_roots = flags.GetAll("--data-root");
  sopt.listen = flags.Get("--listen", sopt.listen);
  sopt.tls_cert_file = flags.Get("--tls-cert");
  sopt.tls_key_file = flags.Get("--tls-key");
  const std::string address_file = flags.Get("--address-file");
  const std::string metrics_bind = flags.Get("--metrics-bind", "0.0.0.0");
  const std::string metrics_address_file = flags.Get("--metrics-address-file");
  // -1: any free port (MetricsServer binds port 0).
  int metrics_port = flags.Get("--metrics-port") == "any" ? -1 : 0;
  Status metrics_port_ok = Status::Ok();
  if (metrics_port == 0 && !flags.GetInt("--metrics-port", &metrics_port, 0, 65535).ok())
    metrics_port_ok = Status::Invalid("--metrics-port: expects a port in [0, 65535] or any, got " +
                                      flags.Get("--metrics-port"));
  for (Status s : {metrics_port_ok,
                   flags.GetInt("--heartbeat-interval-ms", &copt.heartbeat_interval_ms, 1, 1 << 30),
                   flags.GetInt("--heartbeat-timeout-ms", &copt.heartbeat_timeout_ms, 1, 1 << 30)})
    if (!s.ok()) return flags.UsageError(s);
  auto token = rpc::LoadSecret(flags, rpc::kUserToken);
  if (!token.ok()) return Fail(token.status());
  auto secret = rpc::LoadSecret(flags, rpc::kJoinSecret);
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
  if (metrics_port != 0) {
    auto m = MetricsServer::Start(metrics_bind, std::max(metrics_port, 0));
    if (!m.ok()) return Fail(m.status());
    metrics = std::move(m).value();
    metrics->Register(registry);
    copt.aggregates = &aggregates;
  }

  auto coordinator = coord::Coordinator::Open(copt);
  if (!coordinator.ok()) return Fail(coordinator.status());
  auto server = coord::CoordinatorServer::Start(sopt, coordinator->get());
  if (!server.ok()) return Fail(server.status());
  (*coordinator)->Serving();
  const std::string host = sopt.listen.substr(0, sopt.listen.rfind(':'));
  const std::string address = host + ":" + std::to_string((*server)->port());
  // The /metrics address first: whoever waits for --address-file finds both.
  if (metrics && !metrics_address_file.empty()) {
    const std::string a = metrics->bind_address() + ":" + std::to_string(metrics->port());
    if (Status s = WriteFileAtomic(metrics_address_file, a + "\n"); !s.ok()) return Fail(s);
  }
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
