// The control plane end to end, with real processes on loopback: forge-coordinator,
// two forge-worker ranks under mpirun (CPU data parallelism over MPI) and forgectl.
//   - submit / watch / stop / resume through forgectl;
//   - kill -9 a worker mid-run: the run restarts from its last committed checkpoint and ends
//     with the same weights as an unfailed `forge train` resumed from that checkpoint;
//   - kill -9 the coordinator mid-run and restart it: the run finishes, nothing restarted;
//   - credentials, bad specs, unknown ids and path traversal get the right status codes.
#include <gtest/gtest.h>

#include <cstring>
#include <regex>

#include "checkpoint_weights.h"
#include "control_plane_harness.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge {
namespace {

using test::ControlPlane;
using test::Process;
using test::Spawn;
using test::Contains;
using test::ReadFile;
using test::ShellResult;
using test::WaitFor;

TEST(ControlPlane, SubmitWatchStopResume) {
  REQUIRE_MPIRUN();
  ControlPlane cp("stop_resume");
  cp.StartCoordinator();
  cp.StartWorkers(2, /*throttle_ms=*/60);
  const std::string spec = cp.WriteSpec("sr", 40, 20);

  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_FALSE(run.empty()) << sub.output;
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 5; }))
      << cp.Ctl("status " + run).output << ReadFile(cp.dir() + "/workers.0.log");

  ShellResult stop = cp.Ctl("stop " + run);
  ASSERT_EQ(stop.exit_code, 0) << stop.output;
  EXPECT_TRUE(Contains(stop.output, "CHECKPOINTING")) << stop.output;
  ShellResult watch = cp.Ctl("watch " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "[STOPPED]")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "state"), "STOPPED");
  const int64_t stopped_at = cp.Step(run);
  EXPECT_GE(stopped_at, 5);
  EXPECT_LT(stopped_at, 40);

  // The stop saved a checkpoint at the step it stopped.
  ShellResult cks = cp.Ctl("checkpoints " + run);
  ASSERT_EQ(cks.exit_code, 0) << cks.output;
  EXPECT_TRUE(Contains(cks.output, "step_" + std::to_string(stopped_at))) << cks.output;

  ShellResult resume = cp.Ctl("resume " + run);
  ASSERT_EQ(resume.exit_code, 0) << resume.output;
  ShellResult done = cp.Ctl("watch --history " + run);
  EXPECT_EQ(done.exit_code, 0) << done.output;
  EXPECT_TRUE(Contains(done.output, "from step_" + std::to_string(stopped_at))) << done.output;
  EXPECT_TRUE(Contains(done.output, "step 40/40")) << done.output;
  EXPECT_TRUE(Contains(done.output, "COMPLETED")) << done.output;
  EXPECT_EQ(cp.StatusField(run, "state"), "COMPLETED");

  // Export the final weights inside the run dir.
  ShellResult exp = cp.Ctl("export " + run);
  EXPECT_EQ(exp.exit_code, 0) << exp.output;
  EXPECT_TRUE(Contains(exp.output, "step_40.safetensors")) << exp.output;
  // The Hugging Face form goes through the same request; this run's model (vocabulary 256)
  // cannot carry its dataset's GPT-2 tokenizer, which the export names.
  ShellResult hf = cp.Ctl("export " + run + " --format hf");
  EXPECT_NE(hf.exit_code, 0) << hf.output;
  EXPECT_TRUE(Contains(hf.output, "past the model's vocabulary of 256")) << hf.output;
  ShellResult list = cp.Ctl("list");
  EXPECT_TRUE(Contains(list.output, run) && Contains(list.output, "COMPLETED")) << list.output;
}

TEST(ControlPlane, CheckpointOnRequestKeepsTraining) {
  REQUIRE_MPIRUN();
  ControlPlane cp("ckpt_now");
  cp.StartCoordinator();
  cp.StartWorkers(2, /*throttle_ms=*/80);
  const std::string spec = cp.WriteSpec("cn", 40, 0);  // saves only when asked
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 3; })) << cp.Ctl("status " + run).output;
  ShellResult ask = cp.Ctl("checkpoint " + run);
  ASSERT_EQ(ask.exit_code, 0) << ask.output;
  ASSERT_TRUE(WaitFor(30, [&] {
    return std::atoll(cp.StatusField(run, "latest_checkpoint_step").c_str()) > 0;
  })) << cp.Ctl("status " + run).output;
  const int64_t saved = std::atoll(cp.StatusField(run, "latest_checkpoint_step").c_str());
  EXPECT_GE(saved, 3);
  EXPECT_LT(saved, 40);
  ShellResult done = cp.Ctl("watch " + run);
  EXPECT_EQ(done.exit_code, 0) << done.output;
  EXPECT_EQ(cp.StatusField(run, "state"), "COMPLETED");  // it went on to the end
  EXPECT_EQ(cp.Step(run), 40);
  ShellResult again = cp.Ctl("checkpoint " + run);  // not RUNNING any more
  EXPECT_TRUE(Contains(again.output, "FAILED_PRECONDITION")) << again.output;
}

TEST(ControlPlane, ResumeOnAnotherWorkerCount) {
  REQUIRE_MPIRUN();
  ControlPlane cp("reshard");
  cp.StartCoordinator();
  cp.StartWorkers(2, /*throttle_ms=*/60);
  const std::string spec = cp.WriteSpec("rs", 30, 10);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 4; })) << cp.Ctl("status " + run).output;
  ASSERT_EQ(cp.Ctl("stop " + run).exit_code, 0);
  ASSERT_EQ(cp.Ctl("watch " + run).exit_code, 0);
  ASSERT_EQ(cp.StatusField(run, "state"), "STOPPED");

  // One worker started alone (no mpirun): the 2-rank group cannot take a 1-worker run.
  test::Process solo = test::Spawn(test::Bin("forge-worker") + " --coordinator " + cp.address() +
                                       " --join-secret-file " + cp.dir() + "/secret",
                                   cp.dir() + "/solo.log");
  ShellResult resume = cp.Ctl("resume " + run + " --workers 1");
  ASSERT_EQ(resume.exit_code, 0) << resume.output;
  ShellResult done = cp.Ctl("watch " + run);
  solo.Kill();
  EXPECT_EQ(done.exit_code, 0) << done.output << ReadFile(cp.dir() + "/solo.log");
  EXPECT_EQ(cp.StatusField(run, "state"), "COMPLETED");
  EXPECT_EQ(cp.StatusField(run, "workers"), "1");
  ShellResult cks = cp.Ctl("--json checkpoints " + run);
  EXPECT_TRUE(Contains(cks.output, "\"step\":\"30\"")) << cks.output;
  auto m = ReadManifest(cp.StatusField(run, "run_dir") + "/checkpoints/step_30");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->world_size, 1);
}

TEST(ControlPlane, WorkerKilledRunRecoversFromCheckpoint) {
  REQUIRE_MPIRUN();
  ControlPlane cp("worker_kill");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/1500);
  test::Process& first = cp.StartWorkers(2, /*throttle_ms=*/80);
  const std::string spec = cp.WriteSpec("wk", 30, 4);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  // Past a committed checkpoint, well before the end.
  ASSERT_TRUE(WaitFor(60, [&] {
    return std::atoll(cp.StatusField(run, "latest_checkpoint_step").c_str()) >= 8;
  })) << cp.Ctl("status " + run).output;
  ASSERT_LT(cp.Step(run), 30) << "the run ended before the worker could be killed";

  // kill -9 one rank (a child of mpirun); mpirun then takes the other one down.
  ShellResult kids = test::Shell("pgrep -P " + std::to_string(first.pid));
  std::vector<std::string> pids;
  for (size_t at = 0; at < kids.output.size();) {
    size_t nl = kids.output.find('\n', at);
    if (nl == std::string::npos) nl = kids.output.size();
    if (nl > at) pids.push_back(kids.output.substr(at, nl - at));
    at = nl + 1;
  }
  ASSERT_FALSE(pids.empty()) << kids.output;
  ::kill(std::atoi(pids.back().c_str()), SIGKILL);
  ASSERT_TRUE(WaitFor(30, [&] { return cp.StatusField(run, "state") == "RESTARTING"; }))
      << cp.Ctl("status " + run).output;
  first.Wait(30);

  cp.StartWorkers(2, /*throttle_ms=*/0);
  ShellResult watch = cp.Ctl("watch --history " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "[RESTARTING]")) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "[COMPLETED]")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "1");

  // Which checkpoint attempt 2 started from.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(watch.output, m, std::regex("attempt 2 placed .* from step_([0-9]+)")))
      << watch.output;
  const std::string from = "step_" + m[1].str();
  const std::string run_dir = cp.StatusField(run, "run_dir");
  const std::string resumed = run_dir + "/checkpoints/" + from;

  // The unfailed reference: `forge train` on 2 ranks, resumed from that same checkpoint.
  const std::string ref_dir = cp.dir() + "/reference";
  ShellResult ref = test::Shell(test::Mpirun(2) + test::Bin("forge") + " train " + spec +
                                " --run-dir " + ref_dir + " --resume " + resumed);
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const std::vector<float> got = test::CheckpointWeights(run_dir + "/checkpoints/step_30");
  const std::vector<float> want = test::CheckpointWeights(ref_dir + "/checkpoints/step_30");
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "recovered run's final weights differ from the reference resumed at " << from;
}

TEST(ControlPlane, CoordinatorKilledAndRestartedRunFinishes) {
  REQUIRE_MPIRUN();
  ControlPlane cp("coord_kill");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/3000);
  cp.StartWorkers(2, /*throttle_ms=*/60);
  const std::string spec = cp.WriteSpec("ck", 40, 5);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 6; })) << cp.Ctl("status " + run).output;

  cp.KillCoordinator();  // kill -9
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // workers train on, retrying
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/3000);

  ShellResult watch = cp.Ctl("watch " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "COMPLETED")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "0") << cp.Ctl("status " + run).output;
  EXPECT_EQ(cp.Step(run), 40);
  ShellResult cks = cp.Ctl("checkpoints " + run);
  for (int s = 5; s <= 40; s += 5)
    EXPECT_TRUE(Contains(cks.output, "step_" + std::to_string(s) + " ")) << cks.output;
  ShellResult history = cp.Ctl("watch --history " + run);
  EXPECT_TRUE(Contains(history.output, "[PENDING] submitted")) << history.output;
}

// A graceful shutdown (SIGTERM; under Slurm scancel's signal reaches the coordinator too)
// ends the open watch streams and the workers' calls in flight with CANCELLED rather than
// UNAVAILABLE: a watch started before it must reconnect to the restarted coordinator and see
// the run finish, as after kill -9. Down only 0.5 s: the workers' channels must reach the new
// process within its heartbeat timeout (3 s), which the DNS resolver's default 30 s minimum
// between re-resolutions once prevented (~4 s of failed heartbeats).
TEST(ControlPlane, WatchOutlivesAGracefulCoordinatorRestart) {
  REQUIRE_MPIRUN();
  ControlPlane cp("coord_term");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/3000);
  cp.StartWorkers(2, /*throttle_ms=*/60);
  const std::string spec = cp.WriteSpec("ct", 40, 5);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  Process watch = Spawn(cp.CtlCommand("watch " + run), cp.dir() + "/watch.log");
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 4; })) << cp.Ctl("status " + run).output;

  cp.KillCoordinator(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_TRUE(watch.Running()) << "watch gave up on a graceful shutdown:\n"
                               << ReadFile(watch.log);
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/3000);
  const int rc = watch.Wait(120);
  EXPECT_EQ(rc, 0) << ReadFile(watch.log);
  EXPECT_TRUE(Contains(ReadFile(watch.log), "COMPLETED")) << ReadFile(watch.log);
  EXPECT_EQ(cp.Step(run), 40);
}

TEST(ControlPlane, CredentialsSpecsIdsAndPathsGetTheRightCodes) {
  ControlPlane cp("codes");
  cp.StartCoordinator();

  std::ofstream(cp.dir() + "/wrong") << "not-the-token\n";
  ShellResult wrong = cp.Ctl("list", cp.dir() + "/wrong");
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_TRUE(Contains(wrong.output, "UNAUTHENTICATED")) << wrong.output;
  // The workers' join secret is not a user token.
  ShellResult secret = cp.Ctl("list", cp.dir() + "/secret");
  EXPECT_TRUE(Contains(secret.output, "UNAUTHENTICATED")) << secret.output;
  // Nor is the user token a join secret.
  ShellResult worker = test::Shell("timeout 30 " + test::Bin("forge-worker") + " --coordinator " +
                                   cp.address() + " --join-secret-file " + cp.dir() + "/token");
  EXPECT_EQ(worker.exit_code, 1);
  EXPECT_TRUE(Contains(worker.output, "UNAUTHENTICATED")) << worker.output;

  // A strict spec: unknown key, named with its line.
  const std::string bad = cp.WriteSpec("bad", 10, 0, "optimizer: {lr: 0.001, betta2: 0.9}\n");
  ShellResult b = cp.Ctl("submit " + bad);
  EXPECT_EQ(b.exit_code, 1);
  EXPECT_TRUE(Contains(b.output, "INVALID_ARGUMENT")) << b.output;
  EXPECT_TRUE(Contains(b.output, "bad.yaml:10")) << b.output;
  EXPECT_TRUE(Contains(b.output, "betta2")) << b.output;
  const std::string batch = cp.WriteSpec("batch", 10, 0, "");
  {
    std::string text = ReadFile(batch);
    text.replace(text.find("global_batch: 8"), 15, "global_batch: 4");
    std::ofstream(batch) << text;
  }
  ShellResult bb = cp.Ctl("submit " + batch);
  EXPECT_TRUE(Contains(bb.output, "INVALID_ARGUMENT") && Contains(bb.output, "train.workers"))
      << bb.output;

  // Unknown run ids.
  for (const std::string& c : {"status nope-000000", "stop nope-000000", "resume nope-000000",
                               "watch nope-000000", "checkpoints nope-000000"}) {
    ShellResult r = cp.Ctl(c);
    EXPECT_EQ(r.exit_code, 1) << c;
    EXPECT_TRUE(Contains(r.output, "NOT_FOUND")) << c << ": " << r.output;
  }

  // Paths that would leave the run directory.
  for (const std::string& dir : {"/etc", "../../escape", "a/../../b"}) {
    const std::string s = cp.WriteSpec("esc", 10, 0, "");
    std::string text = ReadFile(s);
    text.replace(text.find("keep_last: 50"), 13, "keep_last: 50, dir: \"" + dir + "\"");
    std::ofstream(s) << text;
    ShellResult r = cp.Ctl("submit " + s);
    EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT") && Contains(r.output, "checkpoint.dir"))
        << dir << ": " << r.output;
  }
  const std::string ok_spec = cp.WriteSpec("ok", 10, 0);
  ShellResult sub = cp.Ctl("submit " + ok_spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  for (const std::string& out : {"../x.safetensors", "/tmp/x.safetensors", "a/../../x"}) {
    ShellResult r = cp.Ctl("export " + run + " -o " + out);
    EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT")) << out << ": " << r.output;
  }
  for (const std::string& ck : {"../../step_1", "/etc/passwd", "step_1/../../x"}) {
    ShellResult r = cp.Ctl("export " + run + " --checkpoint " + ck);
    EXPECT_TRUE(Contains(r.output, "INVALID_ARGUMENT")) << ck << ": " << r.output;
  }
  ShellResult stop = cp.Ctl("stop " + run);  // never placed: stops at once
  EXPECT_EQ(stop.exit_code, 0) << stop.output;
  ShellResult res = cp.Ctl("resume " + run + " --checkpoint ../../step_1");
  EXPECT_TRUE(Contains(res.output, "INVALID_ARGUMENT")) << res.output;
  ShellResult missing = cp.Ctl("resume " + run + " --checkpoint step_7");
  EXPECT_TRUE(Contains(missing.output, "NOT_FOUND")) << missing.output;
  ShellResult again = cp.Ctl("stop " + run);
  EXPECT_TRUE(Contains(again.output, "FAILED_PRECONDITION")) << again.output;
}

TEST(ControlPlane, TlsCoordinatorServesOnlyTls) {
  if (test::Shell("command -v openssl").exit_code != 0) GTEST_SKIP() << "no openssl to make a cert";
  ControlPlane cp("tls");
  const std::string d = cp.dir();
  ShellResult cert = test::Shell(
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout " + d + "/key.pem -out " + d +
      "/cert.pem -days 1 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1");
  ASSERT_EQ(cert.exit_code, 0) << cert.output;
  test::Process coordinator = test::Spawn(
      test::Bin("forge-coordinator") + " --state-dir " + d + "/state --listen 127.0.0.1:0" +
          " --token-file " + d + "/token --join-secret-file " + d + "/secret --tls-cert " + d +
          "/cert.pem --tls-key " + d + "/key.pem --address-file " + d + "/tls_address",
      d + "/tls_coordinator.log");
  ASSERT_TRUE(WaitFor(20, [&] { return std::filesystem::exists(d + "/tls_address"); }))
      << ReadFile(d + "/tls_coordinator.log");
  std::string address = ReadFile(d + "/tls_address");
  address.pop_back();
  const std::string ctl = test::Bin("forgectl") + " --coordinator " + address + " --token-file " +
                          d + "/token ";
  ShellResult ok = test::Shell("timeout 30 " + ctl + "--tls-ca " + d + "/cert.pem list");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(Contains(ok.output, "no runs")) << ok.output;
  // A plaintext client never gets an answer (it retries until its timeout).
  ShellResult plain = test::Shell("timeout 3 " + ctl + "list");
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  EXPECT_FALSE(Contains(plain.output, "no runs")) << plain.output;
  coordinator.Kill();
}

// `forge train CONFIG` launched alone trains through an in-process coordinator: its state dir
// holds the run, which a forge-coordinator started later on that dir still lists.
TEST(ControlPlane, ForgeTrainAloneRunsThroughALocalCoordinator) {
  ControlPlane cp("local");
  // eval.samples at steps 3 and 6: the model takes GPT-2's vocabulary (the dataset's tokenizer)
  // so the prompts' ids are its own.
  const std::string spec = cp.WriteSpec("local", 6, 3, "eval: {every_steps: 3, batches: 2, "
                                        "samples: [\"Call me\"], sample_tokens: 4}\n");
  {  // one worker: this process's own (several CPU workers are worker_recovery_test's)
    std::string text = ReadFile(spec);
    text.replace(text.find("workers: 2"), 10, "workers: 1");
    text.replace(text.find("vocab: 256"), 10, "vocab: 50257");
    text.erase(text.find("eval: {every_steps: 0, batches: 2}\n"), 35);
    std::ofstream(spec) << text;
  }
  const std::string run_dir = cp.dir() + "/run";
  ShellResult train = test::Shell("OPENBLAS_NUM_THREADS=1 timeout 120 " + test::Bin("forge") +
                                  " train " + spec + " --run-dir " + run_dir);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  EXPECT_TRUE(Contains(train.output, "step 6/6")) << train.output;
  EXPECT_TRUE(Contains(train.output, "forge: done: 6 steps")) << train.output;
  const std::string state = run_dir + "/coordinator";
  ASSERT_TRUE(std::filesystem::exists(state + "/token"));
  ASSERT_TRUE(std::filesystem::exists(state + "/address"));

  // Serve that state dir and ask it.
  test::Process coordinator = test::Spawn(
      "env FORGE_JOIN_SECRET=x " + test::Bin("forge-coordinator") + " --state-dir " + state +
          " --listen 127.0.0.1:0 --token-file " + state + "/token --address-file " + cp.dir() +
          "/local_address",
      cp.dir() + "/local_coordinator.log");
  ASSERT_TRUE(WaitFor(20, [&] { return std::filesystem::exists(cp.dir() + "/local_address"); }));
  std::string address = ReadFile(cp.dir() + "/local_address");
  address.pop_back();
  const std::string ctl = "timeout 60 " + test::Bin("forgectl") + " --coordinator " + address +
                          " --token-file " + state + "/token ";
  ShellResult list = test::Shell(ctl + "list");
  EXPECT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(Contains(list.output, "COMPLETED")) << list.output;
  EXPECT_TRUE(Contains(list.output, "6/6")) << list.output;
  // The samples are run events: watch --history prints them.
  const size_t at = list.output.find("local-");
  ASSERT_NE(at, std::string::npos) << list.output;
  const std::string run = list.output.substr(at, list.output.find_first_of(" \t\n", at) - at);
  ShellResult watch = test::Shell(ctl + "watch --history " + run);
  coordinator.Kill();
  EXPECT_TRUE(Contains(watch.output, "sample at step 3: \"Call me\" -> \"")) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "sample at step 6: \"Call me\" -> \"")) << watch.output;
  EXPECT_TRUE(Contains(train.output, "sample | \"Call me\" -> ")) << train.output;
}

}  // namespace
}  // namespace forge
