// forge-coordinator-load: a load benchmark for the coordinator (not a test).
//   forge-coordinator-load [--workers 1000] [--per-run 4] [--rate-hz 1] [--seconds 30]
//                          [--threads 16] [--coordinator-bin PATH] [--state-dir DIR]
// Starts forge-coordinator as its own process (so its CPU time can be read from /proc), joins
// --workers simulated GPU workers, submits workers/per-run runs of per-run ranks each so every
// worker is placed, then has every worker heartbeat at --rate-hz (rank 0 carries a new step
// record each time, which the coordinator stores in SQLite) for --seconds. Prints one JSON
// line: heartbeat latency percentiles (client-measured round trip), errors, and the
// coordinator's CPU use (utime + stime over the measured window) and resident memory.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/wait.h>

#include "common/flags.h"
#include "forge/v1/runs.grpc.pb.h"
#include "forge/v1/workers.grpc.pb.h"
#include "rpc/auth.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  int workers = 1000, per_run = 4, threads = 16;
  double rate_hz = 1.0, seconds = 30.0;
  std::string coordinator_bin, state_dir;
};

int Die(const std::string& msg) {
  std::printf("{\"error\":\"%s\"}\n", msg.c_str());
  return 1;
}

// utime + stime of a process, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {  // fields 14, 15: utime, stime
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / double(sysconf(_SC_CLK_TCK));
}

double RssMb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  long pages = 0, rss = 0;
  in >> pages >> rss;
  return double(rss) * double(sysconf(_SC_PAGESIZE)) / 1e6;
}

struct Worker {
  std::string id;
  forge::v1::Assignment a;
  int64_t step = 0;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.coordinator_bin = (std::filesystem::path(argv[0]).parent_path() / "forge-coordinator").string();
  forge::FlagParser flags("forge-coordinator-load", "",
                          "Load test: starts a coordinator and simulated workers that join and "
                          "heartbeat at a rate; prints JSON latency figures.");
  flags.Value("--workers", "N", "simulated workers");
  flags.Value("--per-run", "N", "workers per run");
  flags.Value("--threads", "N", "client threads");
  flags.Value("--rate-hz", "HZ", "heartbeats per worker per second");
  flags.Value("--seconds", "S", "how long to run");
  flags.Value("--coordinator-bin", "PATH", "the forge-coordinator to start");
  flags.Value("--state-dir", "DIR", "its state directory (default a fresh /tmp dir)");
  if (int rc; flags.ParseOrExit(argc, argv, 1, &rc)) return rc;
  for (const forge::Status& s :
       {flags.GetInt("--workers", &o.workers), flags.GetInt("--per-run", &o.per_run),
        flags.GetInt("--threads", &o.threads), flags.GetDouble("--rate-hz", &o.rate_hz),
        flags.GetDouble("--seconds", &o.seconds)})
    if (!s.ok()) return Die(s.message());
  o.coordinator_bin = flags.Get("--coordinator-bin", o.coordinator_bin);
  o.state_dir = flags.Get("--state-dir", o.state_dir);
  if (o.workers < 1 || o.per_run < 1) return Die("--workers and --per-run must be >= 1");
  if (o.workers % o.per_run != 0) return Die("--workers must be a multiple of --per-run");
  if (o.state_dir.empty())
    o.state_dir = "/tmp/forge_coordinator_load_" + std::to_string(getpid());
  std::filesystem::remove_all(o.state_dir);
  std::filesystem::create_directories(o.state_dir);
  const std::string token = forge::rpc::RandomSecret(), secret = forge::rpc::RandomSecret();
  const std::string addr_file = o.state_dir + "/address";

  const pid_t coord = fork();
  if (coord == 0) {
    setenv("FORGE_TOKEN", token.c_str(), 1);
    setenv("FORGE_JOIN_SECRET", secret.c_str(), 1);
    const std::string log = o.state_dir + "/coordinator.log";
    freopen(log.c_str(), "w", stdout);
    freopen(log.c_str(), "a", stderr);
    execl(o.coordinator_bin.c_str(), o.coordinator_bin.c_str(), "--state-dir",
          o.state_dir.c_str(), "--listen", "127.0.0.1:0", "--address-file", addr_file.c_str(),
          "--heartbeat-timeout-ms", "30000", static_cast<char*>(nullptr));
    _exit(127);
  }
  auto stop_coordinator = [&] {
    kill(coord, SIGTERM);
    waitpid(coord, nullptr, 0);
  };
  for (int i = 0; i < 200 && !std::filesystem::exists(addr_file); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::string address;
  std::ifstream(addr_file) >> address;
  if (address.empty()) {
    stop_coordinator();
    return Die("coordinator did not start (" + o.coordinator_bin + ")");
  }

  // A few channels, so the load is not one HTTP/2 connection.
  std::vector<std::unique_ptr<forge::v1::WorkerService::Stub>> stubs;
  for (int i = 0; i < 8; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);  // distinct channels, not one shared subchannel
    stubs.push_back(forge::v1::WorkerService::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
  }
  auto run_stub = forge::v1::RunService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));

  // Runs first, then workers join and are placed.
  const int runs = o.workers / o.per_run;
  const std::string spec =
      "name: load\nmodel: {n_layer: 1, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16}\n"
      "schedule: {total_steps: 1000000, warmup_steps: 1}\n"
      "batch: {micro_batch: 1, global_batch: " + std::to_string(o.per_run) + "}\n"
      "train: {workers: " + std::to_string(o.per_run) + "}\n";
  for (int r = 0; r < runs; ++r) {
    grpc::ClientContext ctx;
    forge::rpc::AddBearer(&ctx, token);
    forge::v1::SubmitRunRequest req;
    req.set_spec_yaml(spec);
    forge::v1::Run run;
    grpc::Status s = run_stub->SubmitRun(&ctx, req, &run);
    if (!s.ok()) {
      stop_coordinator();
      return Die("SubmitRun: " + s.error_message());
    }
  }
  std::vector<Worker> workers(o.workers);
  for (int pass = 0; pass < 2; ++pass) {  // join, then join again to collect placements
    for (int i = 0; i < o.workers; ++i) {
      Worker& w = workers[i];
      w.id = "sim-" + std::to_string(i);
      grpc::ClientContext ctx;
      forge::rpc::AddBearer(&ctx, secret);
      forge::v1::JoinRequest req;
      req.set_worker_id(w.id);
      req.set_device("cuda:0");
      forge::v1::JoinResponse resp;
      grpc::Status s = stubs[i % stubs.size()]->Join(&ctx, req, &resp);
      if (!s.ok()) {
        stop_coordinator();
        return Die("Join: " + s.error_message());
      }
      if (resp.assigned()) w.a = resp.assignment();
    }
  }
  int placed = 0;
  for (const Worker& w : workers) placed += !w.a.run_id().empty();
  if (placed != o.workers) {
    stop_coordinator();
    return Die("only " + std::to_string(placed) + " workers were placed");
  }

  // Heartbeats: worker i beats at start + i/(workers*rate) + k/rate.
  const auto period = std::chrono::duration<double>(1.0 / o.rate_hz);
  const auto start = Clock::now() + std::chrono::milliseconds(200);
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(o.seconds));
  std::mutex mu;
  std::vector<double> latencies_ms;
  std::atomic<int64_t> errors{0}, commands_not_continue{0};
  const double cpu0 = CpuSeconds(coord);
  const auto wall0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<double> mine;
      for (int64_t k = 0;; ++k) {
        for (int i = t; i < o.workers; i += o.threads) {
          const auto due = start + std::chrono::duration_cast<Clock::duration>(
                                       period * (double(i) / o.workers + double(k)));
          if (due >= end) goto done;
          std::this_thread::sleep_until(due);
          Worker& w = workers[i];
          forge::v1::HeartbeatRequest req;
          req.set_worker_id(w.id);
          req.set_run_id(w.a.run_id());
          req.set_attempt(w.a.attempt());
          req.set_rank(w.a.rank());
          req.set_phase(forge::v1::TRAINING);
          if (w.a.rank() == 0) {
            auto* m = req.mutable_metrics();
            m->set_step(++w.step);
            m->set_loss(3.0f);
            m->set_tokens_per_second(1e5);
            m->set_mfu(0.4);
            m->set_step_seconds(0.5);
          }
          grpc::ClientContext ctx;
          forge::rpc::AddBearer(&ctx, secret);
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
          forge::v1::HeartbeatResponse resp;
          const auto t0 = Clock::now();
          grpc::Status s = stubs[i % stubs.size()]->Heartbeat(&ctx, req, &resp);
          const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
          if (!s.ok()) ++errors;
          else if (resp.command() != forge::v1::CONTINUE) ++commands_not_continue;
          mine.push_back(ms);
        }
      }
    done:
      std::lock_guard<std::mutex> l(mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
    });
  }
  for (auto& th : threads) th.join();
  const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
  const double cpu = CpuSeconds(coord) - cpu0;
  const double rss = RssMb(coord);
  stop_coordinator();

  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    if (latencies_ms.empty()) return 0.0;
    return latencies_ms[std::min(latencies_ms.size() - 1, size_t(p * latencies_ms.size()))];
  };
  std::printf(
      "{\"workers\":%d,\"runs\":%d,\"rate_hz\":%.2f,\"seconds\":%.1f,\"heartbeats\":%zu,"
      "\"heartbeats_per_s\":%.1f,\"errors\":%ld,\"non_continue\":%ld,\"p50_ms\":%.3f,"
      "\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"coordinator_cpu_percent\":%.1f,"
      "\"coordinator_rss_mb\":%.1f,\"cores\":%u}\n",
      o.workers, runs, o.rate_hz, wall, latencies_ms.size(), latencies_ms.size() / wall,
      long(errors.load()), long(commands_not_continue.load()), pct(0.5), pct(0.9), pct(0.99),
      latencies_ms.empty() ? 0.0 : latencies_ms.back(), 100.0 * cpu / wall, rss,
      std::thread::hardware_concurrency());
  std::filesystem::remove_all(o.state_dir);
  return errors.load() == 0 ? 0 : 1;
}
