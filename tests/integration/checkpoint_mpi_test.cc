// Checkpoints across processes: forge_checkpoint_check (tests/integration/mpi/) saves with W
// ranks and resumes on W' ranks in every mode (and from another mode's checkpoint), compared
// with one process that never stopped; `forge train --resume`, stop signals and `forge export`
// end to end; hsdp's checkpoints to and from the other modes. Worlds 1, 2 and 4 are powers of
// two, so those runs are bitwise the uninterrupted one (train/cpu_backend.cc,
// parallel/sum_order.h); world 3 is within tolerance.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "counting_dataset.h"
#include "mpi_launch.h"
#include "train_records.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/data/shard.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

using test::Bin;
using test::Forge;
using test::Mpirun;
using test::Records;
using test::Shell;
using test::ShellResult;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string TempDir(const std::string& name) {
  const std::string dir =
      ::testing::TempDir() + "/forge_ckpt_mpi_" + std::to_string(::getpid()) + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// ---------------------------------------------------------------------------------------
// The driver: save on W ranks, resume on W' ranks.

ShellResult Check(int ranks, const std::string& args) {
  ShellResult r = Shell(Mpirun(ranks) + Bin("forge_checkpoint_check") + " " + args);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  EXPECT_TRUE(Contains(r.output, "CHECKPOINT_CHECK OK")) << args << "\n" << r.output;
  std::printf("[ -np %d %s: %.1f s ]\n%s", ranks, args.c_str(), r.seconds, r.output.c_str());
  return r;
}

void ExpectAllModes(const ShellResult& r, const std::string& prefix) {
  for (const char* mode : {"ddp  ", "zero1", "zero2", "fsdp "})
    EXPECT_TRUE(Contains(r.output, prefix + " mode=" + mode)) << r.output;
}

TEST(CheckpointMpi, SavedOnTwoRanksResumesBitwiseOnFourTwoAndOne) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir("from2");
  ExpectAllModes(Check(2, "save --root " + dir + "/save"), "save world=2");
  // Same mode, then each mode from another mode's checkpoint.
  ExpectAllModes(Check(4, "resume --from " + dir + "/save --root " + dir + "/r4"),
                 "resume world=4");
  ExpectAllModes(Check(4, "resume --rotate --from " + dir + "/save --root " + dir + "/r4x"),
                 "resume world=4");
  ExpectAllModes(Check(2, "resume --from " + dir + "/save --root " + dir + "/r2"),
                 "resume world=2");
  ExpectAllModes(Check(2, "resume --rotate --from " + dir + "/save --root " + dir + "/r2x"),
                 "resume world=2");
  ExpectAllModes(Check(1, "resume --from " + dir + "/save --root " + dir + "/r1"),
                 "resume world=1");
  fs::remove_all(dir);
}

TEST(CheckpointMpi, SavedOnFourRanksResumesBitwiseOnTwo) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir("from4");
  ExpectAllModes(Check(4, "save --root " + dir + "/save"), "save world=4");
  ExpectAllModes(Check(2, "resume --from " + dir + "/save --root " + dir + "/r2"),
                 "resume world=2");
  ExpectAllModes(Check(2, "resume --rotate --from " + dir + "/save --root " + dir + "/r2x"),
                 "resume world=2");
  fs::remove_all(dir);
}

// hsdp (parallel/hybrid_groups.h) writes fsdp's layout: its checkpoint resumes in the other
// modes on other world sizes, and fsdp's resumes as hsdp, bitwise the uninterrupted run.
TEST(CheckpointMpi, HsdpCheckpointsResumeInOtherModesAndBack) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir("hsdp");
  const ShellResult saved = Check(4, "save --modes hsdp2 --root " + dir + "/save4");
  EXPECT_TRUE(Contains(saved.output, "save world=4 mode=hsdp2")) << saved.output;
  const ShellResult to2 = Check(2, "resume --from-mode hsdp2 --modes fsdp,ddp,hsdp1 --from " +
                                       dir + "/save4 --root " + dir + "/r2");
  for (const char* m : {"fsdp ", "ddp  ", "hsdp1"})
    EXPECT_TRUE(Contains(to2.output, std::string("resume world=2 mode=") + m + " from hsdp2"))
        << to2.output;
  const ShellResult to1 = Check(1, "resume --from-mode hsdp2 --modes zero1 --from " + dir +
                                       "/save4 --root " + dir + "/r1");
  EXPECT_TRUE(Contains(to1.output, "resume world=1 mode=zero1 from hsdp2")) << to1.output;
  // fsdp saved on 2 ranks -> hsdp on 4 ranks as 2 x 2, 4 x 1 and 1 x 4.
  Check(2, "save --modes fsdp --root " + dir + "/save2");
  const ShellResult to4 = Check(4, "resume --from-mode fsdp --modes hsdp2,hsdp1,hsdp4 --from " +
                                       dir + "/save2 --root " + dir + "/r4");
  for (const char* m : {"hsdp2", "hsdp1", "hsdp4"})
    EXPECT_TRUE(Contains(to4.output, std::string("resume world=4 mode=") + m +
                                         " from fsdp step_3 (saved by 2 ranks)"))
        << to4.output;
  fs::remove_all(dir);
}

// World 3 with 2 micro-steps per rank cannot sum in one process's order (sum_order.h): both
// directions match the uninterrupted run within the parallel tests' tolerance instead.
TEST(CheckpointMpi, ThreeRanksToTwoAndBackWithinTolerance) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir("world3");
  ExpectAllModes(Check(3, "save --global 6 --root " + dir + "/s3"), "save world=3");
  ExpectAllModes(
      Check(2, "resume --global 6 --expect close --from " + dir + "/s3 --root " + dir + "/r2"),
      "resume world=2");
  ExpectAllModes(Check(2, "save --global 6 --root " + dir + "/s2"), "save world=2");
  ExpectAllModes(Check(3, "resume --global 6 --rotate --expect close --from " + dir +
                              "/s2 --root " + dir + "/r3"),
                 "resume world=3");
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------
// `forge train` / `forge export` on a small synthetic dataset.

void WriteDataset(const std::string& dir) {
  test::WriteCountingDataset(dir, 777u, 40000, 4000);
}

std::string WriteConfig(const std::string& dir, const std::string& mode, int total_steps,
                        int every_steps) {
  const std::string path = dir + "/run_" + mode + ".yaml";
  std::ofstream y(path);
  y << "name: ckpt-test\nseed: 9\n"
       "model: {n_layer: 2, d_model: 32, n_head: 4, n_kv_head: 2, ffn: 64, vocab: 256, "
       "seq_len: 16}\n"
       "data: {dataset_dir: "
    << dir << "/data}\n"
    << "schedule: {total_steps: " << total_steps << ", warmup_steps: 2}\n"
    << "batch: {micro_batch: 2, global_batch: 8}\n"
       "parallel: {mode: "
    << mode << ", collective_timeout_s: 60}\n"
    << "checkpoint: {every_steps: " << every_steps << ", keep_last: 2}\n"
    << "eval: {every_steps: 3, batches: 3}\n"
       "train: {backend: cpu, log_every: 1}\n";
  return path;
}

TEST(CheckpointMpi, ForgeTrainResumesOnAnotherWorldSizeAndExports) {
  REQUIRE_MPIRUN();
  const std::string dir = TempDir("cli");
  WriteDataset(dir + "/data");
  const std::string fsdp = WriteConfig(dir, "fsdp", 6, 2);
  const std::string zero1 = WriteConfig(dir, "zero1", 6, 2);

  ShellResult ref = Shell(Forge("train " + zero1 + " --run-dir " + dir + "/ref"));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  // 4 ranks (fsdp) stop after step 3; 2 ranks (zero1) resume and finish.
  ShellResult first =
      Shell(Mpirun(4) + Bin("forge") + " train " + fsdp + " --steps 3 --run-dir " + dir + "/run");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(Contains(first.output, "checkpoint step_3:")) << first.output;
  ShellResult again = Shell(Forge("train " + zero1 + " --run-dir " + dir + "/run"));
  EXPECT_NE(again.exit_code, 0) << "a fresh run over existing checkpoints must refuse";
  EXPECT_TRUE(Contains(again.output, "--resume latest")) << again.output;
  ShellResult second = Shell(Mpirun(2) + Bin("forge") + " train " + zero1 +
                             " --resume latest --run-dir " + dir + "/run");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  std::printf("[ forge train: reference %.1f s, 4 ranks to step 3 %.1f s, 2 ranks on %.1f s ]\n%s",
              ref.seconds, first.seconds, second.seconds, second.output.c_str());
  EXPECT_TRUE(Contains(second.output, "resumed from " + dir + "/run/checkpoints/step_3"))
      << second.output;
  EXPECT_TRUE(Contains(second.output, "saved by 4 ranks, fsdp")) << second.output;
  const auto want = Records(dir + "/ref/metrics.jsonl");
  ASSERT_EQ(want.size(), 6u);
  EXPECT_EQ(Records(dir + "/run/metrics.jsonl"), want);

  // keep_last 2: step_4 and step_6 remain.
  std::vector<int64_t> steps;
  for (const auto& e : ListCheckpoints(dir + "/run/checkpoints")) steps.push_back(e.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{4, 6}));

  // Export: the weights of the latest checkpoint under GPT-2-style names.
  const std::string out = dir + "/model.safetensors";
  ShellResult ex = Shell(Forge("export --checkpoint latest --run-dir " + dir + "/run -o " + out));
  ASSERT_EQ(ex.exit_code, 0) << ex.output;
  std::printf("%s", ex.output.c_str());
  EXPECT_TRUE(Contains(ex.output, "exported step 6")) << ex.output;
  EXPECT_TRUE(Contains(ex.output, "transformer.h.{0..1}.attn.c_attn.weight")) << ex.output;
  EXPECT_TRUE(Contains(ex.output, "transformer.wte.weight")) << ex.output;
  auto file = ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto full = LoadFullCheckpoint(dir + "/run/checkpoints/step_6");
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ASSERT_TRUE(file->tensors.count("transformer.wte.weight"));
  const auto& wte = file->tensors.at("transformer.wte.weight");
  EXPECT_EQ(wte.dtype, "F32");
  EXPECT_EQ(wte.shape, (std::vector<int64_t>{256, 32}));
  ASSERT_EQ(wte.bytes.size(), 256u * 32 * 4);
  EXPECT_EQ(0, std::memcmp(wte.bytes.data(), full->master[0].data(), wte.bytes.size()));
  EXPECT_EQ(file->tensors.count("transformer.h.1.mlp.c_proj.weight"), 1u);

  ShellResult bf = Shell(Forge("export --checkpoint " + dir + "/run/checkpoints/step_4 -o " +
                               dir + "/model_bf16.safetensors --dtype bf16"));
  ASSERT_EQ(bf.exit_code, 0) << bf.output;
  auto half = ReadSafetensors(dir + "/model_bf16.safetensors");
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  EXPECT_EQ(half->tensors.at("transformer.wte.weight").dtype, "BF16");
  EXPECT_EQ(half->tensors.at("transformer.wte.weight").bytes.size(), 256u * 32 * 2);
  fs::remove_all(dir);
}

// A stop signal: a checkpoint at the next step boundary, a clean exit, and a continuation
// identical to a run that was never stopped. `to_launcher`: signal mpirun itself (Open MPI
// forwards SIGUSR1 to every rank; on SIGTERM it stops relaying output and kills the ranks after
// odls_base_sigkill_timeout instead); else one rank process only, as scancel or a node's
// shutdown would (the ranks must agree to stop together).
void StopAndResume(int ranks, const std::string& signal, bool to_launcher) {
  const std::string dir = TempDir("stop_" + std::to_string(ranks) + "_" + signal);
  WriteDataset(dir + "/data");
  const std::string cfg = WriteConfig(dir, "zero2", 5000, 0);  // only the stop saves
  const std::string launch = ranks == 1 ? Forge("") : Mpirun(ranks) + Bin("forge") + " ";
  // The launcher is `timeout`; under it mpirun, under that the forge ranks.
  const std::string target =
      to_launcher ? "$(pgrep -P $L)" : "$(pgrep -n -x forge -P \"$L,$(pgrep -d, -P $L)\")";
  const std::string script =
      "cd " + dir + "; (" + launch + "train " + cfg + " --run-dir " + dir +
      "/run > out.txt 2>&1 & echo $! > launcher.pid; wait $!; echo \"exit=$?\" >> out.txt) & "
      "for i in $(seq 600); do [ -f run/metrics.jsonl ] && [ $(wc -l < run/metrics.jsonl) -ge 3 ] "
      "&& break; sleep 0.05; done; "
      "L=$(cat launcher.pid); kill -" + signal + " " + target + "; wait";
  ShellResult r = Shell("bash -c '" + script + "'");
  std::ifstream in(dir + "/out.txt");
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::printf("[ %d rank(s), SIG%s to %s: %.1f s ]\n%s", ranks, signal.c_str(),
              to_launcher ? "mpirun" : "one rank", r.seconds, out.c_str());
  ASSERT_TRUE(Contains(out, "exit=0")) << out;
  ASSERT_TRUE(Contains(out, "forge: stopped on a signal after step ")) << out;
  const auto ckpts = ListCheckpoints(dir + "/run/checkpoints");
  ASSERT_EQ(ckpts.size(), 1u) << out;
  const int64_t stopped = ckpts[0].step;
  EXPECT_GE(stopped, 3);
  EXPECT_TRUE(Contains(out, "checkpoint step_" + std::to_string(stopped) + ":")) << out;

  const std::string until = std::to_string(stopped + 2);
  ShellResult cont = Shell(launch + "train " + cfg + " --resume latest --steps " + until +
                           " --run-dir " + dir + "/run");
  ASSERT_EQ(cont.exit_code, 0) << cont.output;
  ShellResult ref = Shell(Forge("train " + cfg + " --steps " + until + " --run-dir " + dir + "/ref"));
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  const auto want = Records(dir + "/ref/metrics.jsonl");
  EXPECT_EQ(int64_t(want.size()), stopped + 2);
  EXPECT_EQ(Records(dir + "/run/metrics.jsonl"), want);
  fs::remove_all(dir);
}

TEST(CheckpointMpi, SigtermStopsOneProcessAtAStepBoundaryWithACheckpoint) {
  StopAndResume(1, "TERM", false);
}

TEST(CheckpointMpi, SigtermToOneRankStopsTheWholeJobWithACheckpoint) {
  REQUIRE_MPIRUN();
  StopAndResume(2, "TERM", false);
}

TEST(CheckpointMpi, Sigusr1ToMpirunStopsTheJobWithACheckpoint) {
  REQUIRE_MPIRUN();
  StopAndResume(2, "USR1", true);
}

}  // namespace
}  // namespace forge
