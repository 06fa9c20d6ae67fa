// forge_checkpoint_check: checkpoint save and resume across world sizes and parallel modes.
// The integration tests (tests/integration/checkpoint_mpi_test.cc) launch it under mpirun:
//
// Both take --global G (default 8: the global batch, in single sequences).
//
//   forge_checkpoint_check save --root DIR [--steps K] [--modes ddp,zero1,zero2,fsdp]
//       Trains a tiny model K steps in each mode over all ranks with checkpoints every 2
//       steps (and at K) under DIR/<mode>, and checks what was committed: step_K with one
//       shard per rank, the world size and mode in its manifest.
//   forge_checkpoint_check resume --from DIR --root DIR2 [--steps K] [--total T]
//                                 [--modes ...] [--rotate | --from-mode M]
//                                 [--expect bitwise|close]
//       For each mode, resumes from DIR/<mode>/step_K (--rotate: from the checkpoint another
//       mode saved: ddp <- fsdp <- zero2 <- zero1 <- ddp) on all ranks, trains to step T
//       saving under DIR2/<mode>, and compares with one process that trained T steps without
//       interruption (computed on rank 0): the loss, grad norm and val loss of steps K+1..T,
//       the final weights and AdamW moments, and the checkpoint saved at T.
//       --from-mode M: every mode resumes from DIR/M/step_K (e.g. fsdp and ddp from an hsdp
//       checkpoint, hsdp from an fsdp one).
// Modes: ddp, zero1, zero2, fsdp, and hsdpG (hsdp with shard groups of G ranks).
//
// Rank 0 prints one line per mode and "CHECKPOINT_CHECK OK" when everything held; the exit
// status is non-zero otherwise.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "driver_util.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge {
namespace {

using check::ArgValue;
using check::Checker;
using check::Diff;
using check::HasFlag;
using check::Outcome;
using check::ParseMode;

uint64_t Hash(uint64_t x) {  // 32 bits of a 64-bit finaliser
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return uint32_t(x ^ (x >> 33));
}

// Micro-batches of one sequence: global 8 gives 8, 4 and 2 micro-steps per rank on 1, 2 and 4
// ranks; global 6 gives 3 on 2 ranks and 2 on 3.
RunConfig TinyConfig(int64_t total_steps, int64_t global) {
  RunConfig c = check::TinyConfig(21, global, 1, total_steps);
  c.checkpoint.every_steps = 2;
  c.parallel.collective_timeout_s = 120;
  return c;
}

Status Train(const RunConfig& cfg, Comm* comm, int64_t max_steps, Outcome* out) {
  return check::Train(cfg, Hash, comm, max_steps, out);
}

std::vector<std::string> Modes(int argc, char** argv) {
  return check::SplitModes(ArgValue(argc, argv, "--modes", "ddp,zero1,zero2,fsdp"));
}

// The mode whose checkpoint `mode` resumes from with --rotate.
std::string Rotated(const std::string& mode) {
  if (mode == "ddp") return "fsdp";
  if (mode == "fsdp") return "zero2";
  if (mode == "zero2") return "zero1";
  return "ddp";
}

int RunSave(Comm* comm, int argc, char** argv) {
  const int rank = comm->rank(), W = comm->world();
  Checker c{rank};
  const std::string root = ArgValue(argc, argv, "--root", "");
  const int64_t steps = std::atoll(ArgValue(argc, argv, "--steps", "3").c_str());
  const int64_t total = std::atoll(ArgValue(argc, argv, "--total", "6").c_str());
  const int64_t global = std::atoll(ArgValue(argc, argv, "--global", "8").c_str());
  for (const std::string& mode : Modes(argc, argv)) {
    RunConfig cfg = TinyConfig(total, global);
    if (!ParseMode(mode, &cfg.parallel)) {
      c.Expect(false, "unknown mode " + mode);
      continue;
    }
    cfg.checkpoint.dir = root + "/" + mode;
    Outcome got;
    Status st = Train(cfg, comm, steps, &got);
    if (!st.ok()) comm->Abort(st.Annotate("save, mode " + mode));
    if (rank != 0) continue;
    auto m = ReadManifest(StepDir(cfg.checkpoint.dir, steps));
    c.Expect(m.ok(), "mode " + mode + ": step_" + std::to_string(steps) + " committed: " +
                         m.status().ToString());
    if (!m.ok()) continue;
    // Every mode writes one shard per rank (hsdp too: rank r of W writes ShardOf(r, W), so each
    // element is written once, by one replica group's rank, in fsdp's layout).
    c.Expect(m->world_size == W && m->parallel_mode == ParallelModeName(cfg.parallel.mode) &&
                 int(m->shards.size()) == W,
             "mode " + mode + ": manifest names the world size, mode and one shard per rank");
    c.Expect(m->data_cursor == steps * cfg.batch.global_batch, "mode " + mode + ": data cursor");
    for (int r = 0; r < W; ++r)
      c.Expect(std::filesystem::exists(StepDir(cfg.checkpoint.dir, steps) + "/" +
                                       ShardFileName(r, W)),
               "mode " + mode + ": shard of rank " + std::to_string(r));
    std::printf("save world=%d mode=%-5s %ld steps: checkpoints", W, mode.c_str(), long(steps));
    for (int64_t s : got.result.checkpoints) std::printf(" step_%ld", long(s));
    std::printf("; %.2f s\n", got.seconds);
  }
  return c.failures;
}

int RunResume(Comm* comm, int argc, char** argv) {
  const int rank = comm->rank(), W = comm->world();
  Checker c{rank};
  const std::string from = ArgValue(argc, argv, "--from", "");
  const std::string root = ArgValue(argc, argv, "--root", "");
  const int64_t steps = std::atoll(ArgValue(argc, argv, "--steps", "3").c_str());
  const int64_t total = std::atoll(ArgValue(argc, argv, "--total", "6").c_str());
  const int64_t global = std::atoll(ArgValue(argc, argv, "--global", "8").c_str());
  const bool rotate = HasFlag(argc, argv, "--rotate");
  const std::string from_mode = ArgValue(argc, argv, "--from-mode", "");
  const bool bitwise = ArgValue(argc, argv, "--expect", "bitwise") == "bitwise";
  // The parallel tests' tolerance where the canonical sum order cannot match one process.
  const double curve_tol = 1e-6, state_tol = 1e-4;

  Outcome ref;
  if (rank == 0) {
    RunConfig cfg = TinyConfig(total, global);
    cfg.checkpoint.every_steps = 0;
    Status st = Train(cfg, nullptr, -1, &ref);
    c.Expect(st.ok(), "single-process reference: " + st.ToString());
  }
  const ParamLayout layout = MakeParamLayout(TinyConfig(total, global).model);

  for (const std::string& mode : Modes(argc, argv)) {
    RunConfig cfg = TinyConfig(total, global);
    if (!ParseMode(mode, &cfg.parallel)) {
      c.Expect(false, "unknown mode " + mode);
      continue;
    }
    const std::string source = !from_mode.empty() ? from_mode : rotate ? Rotated(mode) : mode;
    cfg.checkpoint.resume = StepDir(from + "/" + source, steps);
    cfg.checkpoint.dir = root + "/" + mode;
    Outcome got;
    Status st = Train(cfg, comm, -1, &got);
    if (!st.ok()) comm->Abort(st.Annotate("resume, mode " + mode));
    if (rank != 0) continue;

    Diff curve, weights, moments, saved;
    curve.AddCurves(got.records, ref.records, steps);
    weights.Add(got.w, ref.w);
    moments.Add(got.m, ref.m);
    moments.Add(got.v, ref.v);
    auto src = ReadManifest(cfg.checkpoint.resume);
    const int src_world = src.ok() ? src->world_size : -1;
    auto last = LoadFullCheckpoint(StepDir(cfg.checkpoint.dir, total), &layout);
    c.Expect(last.ok(), "mode " + mode + ": final checkpoint loads: " + last.status().ToString());
    if (last.ok()) {
      saved.Add(last->master, ref.w);
      saved.Add(last->m, ref.m);
      saved.Add(last->v, ref.v);
      c.Expect(last->manifest.world_size == W, "mode " + mode + ": final checkpoint world size");
    }
    std::printf(
        "resume world=%d mode=%-5s from %s step_%ld (saved by %d ranks) to step %ld: "
        "loss/norm/val %s; weights %s; moments %s; final checkpoint %s; %.2f s\n",
        W, mode.c_str(), source.c_str(), long(got.result.resumed_step), src_world, long(total),
        curve.Text().c_str(), weights.Text().c_str(), moments.Text().c_str(),
        saved.Text().c_str(), got.seconds);
    c.Expect(got.result.resumed_step == steps, "mode " + mode + ": resumed at the saved step");
    c.Expect(int64_t(got.records.size()) == total - steps, "mode " + mode + ": one record per step");
    if (bitwise) {
      c.Expect(curve.differing == 0 && weights.differing == 0 && moments.differing == 0 &&
                   saved.differing == 0,
               "mode " + mode + ": bitwise equal to the uninterrupted single process");
    } else {
      c.Expect(curve.max_rel <= curve_tol && weights.max_rel <= state_tol &&
                   moments.max_rel <= state_tol && saved.max_rel <= state_tol,
               "mode " + mode + ": within tolerance of the uninterrupted single process");
    }
  }
  return c.failures;
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  return check::MpiCheckMain(
      argc, argv, "forge_checkpoint_check save|resume [flags]", "CHECKPOINT_CHECK OK",
      [](const std::string&) {
        MpiCommOptions o;
        o.timeout_s = 120;
        return o;
      },
      [argc, argv](const std::string& cmd, Comm* comm, const MpiCommOptions&) {
        if (cmd == "save") return RunSave(comm, argc, argv);
        if (cmd == "resume") return RunResume(comm, argc, argv);
        std::fprintf(stderr, "unknown check %s\n", cmd.c_str());
        return 1;
      });
}
