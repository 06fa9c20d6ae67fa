// The control plane under an unlucky or hostile user, with real processes on loopback
// (forge-coordinator, forge-worker ranks under mpirun, forgectl):
//   - a coordinator paused (SIGSTOP) for longer than the heartbeat timeout keeps its workers:
//     the run finishes without a restart;
//   - `forgectl watch` rides out a coordinator that is down for half a minute, saying so on
//     stderr;
//   - specs that are not UTF-8, or hold huge values, get INVALID_ARGUMENT with the place and a
//     bounded excerpt;
//   - data paths stay under the coordinator's --data-root; a manifest that cannot be written
//     is reported with its path and an I/O code.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "control_plane_harness.h"

namespace forge {
namespace {

using test::Contains;
using test::ControlPlane;
using test::Process;
using test::ReadFile;
using test::ShellResult;
using test::Spawn;
using test::WaitFor;

// SIGSTOP for three heartbeat timeouts: the heartbeats the workers sent meanwhile are queued
// behind the stopped process, so its monitor must not take its own absence for theirs.
TEST(ControlPlaneFaults, PausedCoordinatorKeepsItsWorkers) {
  REQUIRE_MPIRUN();
  ControlPlane cp("pause");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/2000);
  cp.StartWorkers(2, /*throttle_ms=*/60);
  const std::string spec = cp.WriteSpec("pz", 40, 5);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 4; })) << cp.Ctl("status " + run).output;

  cp.SignalCoordinator(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(6000));
  cp.SignalCoordinator(SIGCONT);

  ShellResult watch = cp.Ctl("watch " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "COMPLETED")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "0") << cp.Ctl("status " + run).output;
  ShellResult history = cp.Ctl("watch --history " + run);
  EXPECT_FALSE(Contains(history.output, "sent no heartbeat")) << history.output;
  EXPECT_TRUE(Contains(history.output, "the coordinator did not run for")) << history.output;
}

// The coordinator is gone for longer than half a minute (a requeued job, a rescheduled pod):
// a watch started before keeps reconnecting with backoff, says so on stderr, prints no event
// twice and ends with the run.
TEST(ControlPlaneFaults, WatchReconnectsAcrossALongCoordinatorOutage) {
  REQUIRE_MPIRUN();
  ControlPlane cp("watch_outage");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/3000);
  cp.StartWorkers(2, /*throttle_ms=*/60);
  ShellResult sub = cp.Ctl("submit " + cp.WriteSpec("wo", 60, 5));
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  Process watch = Spawn(cp.CtlCommand("watch " + run), cp.dir() + "/watch.log");
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 6; })) << cp.Ctl("status " + run).output;

  cp.KillCoordinator();  // kill -9
  std::this_thread::sleep_for(std::chrono::seconds(33));
  EXPECT_TRUE(watch.Running()) << "watch gave up while the coordinator was down:\n"
                               << ReadFile(watch.log);
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/3000);
  EXPECT_EQ(watch.Wait(120), 0) << ReadFile(watch.log);
  const std::string out = ReadFile(watch.log);
  EXPECT_TRUE(Contains(out, "COMPLETED")) << out;
  EXPECT_TRUE(Contains(out, "forgectl: lost the coordinator")) << out;
  EXPECT_TRUE(Contains(out, "forgectl: reconnected to the coordinator after")) << out;
  std::istringstream lines(out);
  std::set<std::string> events;
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '[') EXPECT_TRUE(events.insert(line).second) << line;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "0");
}

// Replaces the value of `key: ` in a spec's text (up to the next ',' '}' or newline).
std::string WithValue(std::string text, const std::string& key, const std::string& value) {
  const size_t at = text.find(key + ": ");
  if (at == std::string::npos) return text;
  const size_t from = at + key.size() + 2;
  const size_t to = text.find_first_of(",}\n", from);
  return text.replace(from, to - from, value);
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A spec that is not UTF-8 reaches the coordinator (SubmitRunRequest.spec_yaml is bytes) and
// is refused with the line and column; a huge value, key or name is quoted as a short excerpt
// (a 100 KB one used to come back whole, or break the reply with RESOURCE_EXHAUSTED).
TEST(ControlPlaneFaults, SpecsNotUtf8OrWithHugeValuesGetBoundedInvalidArgument) {
  ControlPlane cp("hostile_specs");
  cp.StartCoordinator();
  const std::string base = ReadFile(cp.WriteSpec("base", 10, 0));

  std::string latin1 = base;
  latin1.insert(latin1.find('\n') + 1, "# caf\xe9 au lait\n");  // Latin-1, line 2
  Write(cp.dir() + "/latin1.yaml", latin1);
  ShellResult r = cp.Ctl("submit " + cp.dir() + "/latin1.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT")) << r.output;
  EXPECT_TRUE(Contains(r.output, "latin1.yaml:2: not valid UTF-8 text: column 6")) << r.output;
  EXPECT_TRUE(Contains(r.output, "0xe9")) << r.output;

  const std::string huge(100000, 'x');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"name", WithValue(base, "name", huge + " y")},
      {"key", base + "optimizer: {lr: 0.001, " + huge.substr(0, 1000) + ": 1}\n"},  // YAML: <= 1024
      {"lr", base + "optimizer: {lr: " + huge + "}\n"},
      {"dir", WithValue(base, "keep_last", "50, dir: /" + huge)},
      {"medium", base + "optimizer: {lr: \"" + std::string(5000, 'y') + "\"}\n"},
  };
  for (const auto& [what, text] : cases) {
    Write(cp.dir() + "/huge.yaml", text);
    r = cp.Ctl("submit " + cp.dir() + "/huge.yaml");
    EXPECT_EQ(r.exit_code, 1) << what;
    EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT")) << what << ": " << r.output.substr(0, 500);
    EXPECT_LT(r.output.size(), 1500u) << what << ": " << r.output.substr(0, 500);
    EXPECT_TRUE(Contains(r.output, "bytes)")) << what << ": " << r.output;  // says it was cut
  }
  // A huge run id in a request is quoted the same way.
  r = cp.Ctl("status " + huge);
  EXPECT_TRUE(Contains(r.output, "NOT_FOUND")) << r.output.substr(0, 500);
  EXPECT_LT(r.output.size(), 1500u) << r.output.substr(0, 500);
}

// Under a shared coordinator a spec reads data only under its --data-root (the harness gives
// the test's dir): "..", absolute paths elsewhere and symbolic links out are refused, in
// data.dataset_dir and every data.sources entry; without --data-root a spec may not name a
// dataset at all.
TEST(ControlPlaneFaults, DataPathsStayUnderTheDataRoots) {
  ControlPlane cp("roots");
  cp.StartCoordinator();
  const std::string base = ReadFile(cp.WriteSpec("roots", 10, 0));
  std::filesystem::create_symlink("/etc", cp.dir() + "/etc_link");
  for (const std::string& dir : {std::string("../../etc"), std::string("/etc"),
                                 cp.dir() + "/../elsewhere", cp.dir() + "/etc_link/ssl",
                                 std::string("etc_link")}) {
    Write(cp.dir() + "/esc.yaml", WithValue(base, "dataset_dir", "\"" + dir + "\""));
    ShellResult r = cp.Ctl("submit " + cp.dir() + "/esc.yaml");
    EXPECT_EQ(r.exit_code, 1) << dir;
    EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT") && Contains(r.output, "data.dataset_dir") &&
                Contains(r.output, "outside the data roots"))
        << dir << ": " << r.output;
  }
  // Each source of a mixture alike.
  std::string mixture = base;
  const size_t data_at = mixture.find("data: {");
  mixture.replace(data_at, mixture.find('\n', data_at) - data_at,
                  "data: {sources: [{dir: " + cp.dir() + "/data, weight: 1}, {dir: /etc, weight: 1}]}");
  Write(cp.dir() + "/mix.yaml", mixture);
  ShellResult mix = cp.Ctl("submit " + cp.dir() + "/mix.yaml");
  EXPECT_TRUE(Contains(mix.output, "INVALID_ARGUMENT") &&
              Contains(mix.output, "data.sources[1].dir '/etc'") &&
              Contains(mix.output, "outside the data roots"))
      << mix.output;

  // Relative to the root: accepted, stored under it.
  Write(cp.dir() + "/rel.yaml", WithValue(base, "dataset_dir", "data"));
  ShellResult ok = cp.Ctl("submit " + cp.dir() + "/rel.yaml");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  const std::string run = ControlPlane::RunId(ok);
  EXPECT_TRUE(Contains(cp.Ctl("--json status " + run).output,
                       "dataset_dir: \\\"" + std::filesystem::canonical(cp.dir()).string() +
                           "/data\\\""))
      << cp.Ctl("--json status " + run).output;

  // No --data-root: no dataset path in specs.
  const std::string d = cp.dir();
  Process bare = Spawn(test::Bin("forge-coordinator") + " --state-dir " + d +
                           "/bare_state --listen 127.0.0.1:0 --token-file " + d +
                           "/token --join-secret-file " + d + "/secret --address-file " + d +
                           "/bare_address",
                       d + "/bare.log");
  ASSERT_TRUE(WaitFor(20, [&] { return std::filesystem::exists(d + "/bare_address"); }));
  std::string address = ReadFile(d + "/bare_address");
  address.pop_back();
  ShellResult r = test::Shell("timeout 60 " + test::Bin("forgectl") + " --coordinator " +
                              address + " --token-file " + d + "/token submit " + d +
                              "/rel.yaml");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT") && Contains(r.output, "--data-root"))
      << r.output;
  bare.Kill();
}

// The coordinator cannot write a checkpoint's manifest (here a directory sits where its
// temporary file goes): the worker hears an I/O failure with the path, not INTERNAL, and the
// run fails with it. One worker: a failed rank of several aborts its MPI job before it can say
// why.
TEST(ControlPlaneFaults, AManifestThatCannotBeWrittenIsReportedWithItsPath) {
  REQUIRE_MPIRUN();
  ControlPlane cp("manifest");
  cp.StartCoordinator();
  std::string spec = ReadFile(cp.WriteSpec("mf", 20, 2));
  spec = WithValue(WithValue(spec, "max_restarts", "0"), "workers", "1");
  Write(cp.dir() + "/mf.yaml", spec);
  ShellResult sub = cp.Ctl("submit " + cp.dir() + "/mf.yaml");
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  const std::string manifest = cp.StatusField(run, "run_dir") + "/checkpoints/step_2/manifest.json";
  std::filesystem::create_directories(manifest + ".tmp");
  cp.StartWorkers(1, /*throttle_ms=*/20);
  ShellResult watch = cp.Ctl("watch " + run);
  EXPECT_EQ(watch.exit_code, 1) << watch.output;
  const std::string reason = cp.StatusField(run, "state_reason");
  EXPECT_TRUE(Contains(reason, manifest)) << reason;
  EXPECT_TRUE(Contains(reason, "FAILED_PRECONDITION")) << reason;
  EXPECT_FALSE(Contains(reason, "INTERNAL")) << reason;
}

}  // namespace
}  // namespace forge
