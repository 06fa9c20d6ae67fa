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
//                                 [--modes ...] [--rotate] [--expect bitwise|close]
//       For each mode, resumes from DIR/<mode>/step_K (--rotate: from the checkpoint another
//       mode saved: ddp <- fsdp <- zero2 <- zero1 <- ddp) on all ranks, trains to step T
//       saving under DIR2/<mode>, and compares with one process that trained T steps without
//       interruption (computed on rank 0): the loss, grad norm and val loss of steps K+1..T,
//       the final weights and AdamW moments, and the checkpoint saved at T.
//
// Rank 0 prints one line per mode and "CHECKPOINT_CHECK OK" when everything held; the exit
// status is non-zero otherwise.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/config.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/sampler.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/mpi_comm.h"
#include "worker/train/backend.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

std::string ArgValue(int argc, char** argv, const std::string& flag, const std::string& def) {
  for (int i = 2; i + 1 < argc; ++i)
    if (flag == argv[i]) return argv[i + 1];
  return def;
}
bool HasFlag(int argc, char** argv, const std::string& flag) {
  for (int i = 2; i < argc; ++i)
    if (flag == argv[i]) return true;
  return false;
}

struct Checker {
  int rank = 0;
  int failures = 0;
  void Expect(bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
    }
  }
};

// Micro-batches of one sequence: global 8 gives 8, 4 and 2 micro-steps per rank on 1, 2 and 4
// ranks; global 6 gives 3 on 2 ranks and 2 on 3.
RunConfig TinyConfig(int64_t total_steps, int64_t global) {
  RunConfig c;
  c.seed = 21;
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn = 64;
  c.model.vocab = 96;  // padded to 128
  c.model.seq_len = 16;
  c.model.qk_norm = true;
  c.batch.micro_batch = 1;
  c.batch.global_batch = global;
  c.optimizer.lr = 1e-2f;
  c.optimizer.grad_clip = 0.5f;
  c.schedule.total_steps = total_steps;
  c.schedule.warmup_steps = 2;
  c.eval.every_steps = 2;
  c.eval.batches = 3;
  c.train.log_every = 1;
  c.checkpoint.every_steps = 2;
  c.parallel.collective_timeout_s = 120;
  return c;
}

uint32_t Hash(uint64_t x) {
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ull;
  return uint32_t(x ^ (x >> 33));
}

// Sequence s of the training stream (val: s >= 1e6): pseudo-random tokens.
void FillSequence(const RunConfig& c, int64_t s, int32_t* in, int32_t* tgt) {
  const int T = c.model.seq_len;
  for (int t = 0; t < T; ++t) {
    in[t] = int32_t(Hash(uint64_t(s) * 1000 + t) % uint32_t(c.model.vocab));
    tgt[t] = int32_t(Hash(uint64_t(s) * 1000 + t + 1) % uint32_t(c.model.vocab));
  }
}

// Rank `rank` of `world`'s slice of each global batch, laid out as the sampler does.
BatchProvider SyntheticData(const RunConfig& c, int rank, int world) {
  BatchProvider p;
  p.train = [c, rank, world](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    const int b = c.batch.micro_batch, T = c.model.seq_len;
    const int64_t first = SliceStart(cursor, rank, world, b, k);
    for (int j = 0; j < b; ++j) FillSequence(c, first + j, in + j * T, tgt + j * T);
    return Status::Ok();
  };
  p.val = [c](int64_t i, int32_t* in, int32_t* tgt) {
    const int b = c.batch.micro_batch, T = c.model.seq_len;
    for (int j = 0; j < b; ++j) FillSequence(c, 1'000'000 + i * b + j, in + j * T, tgt + j * T);
    return Status::Ok();
  };
  return p;
}

struct Outcome {
  TrainResult result;
  std::vector<StepRecord> records;
  UnitBuffers w, m, v;
  double seconds = 0;
};

Status Train(const RunConfig& cfg, Comm* comm, int64_t max_steps, Outcome* out) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world() : 1;
  auto backend = MakeCpuBackend(cfg, comm);
  TrainOptions opt;
  opt.print_progress = false;
  opt.comm = comm;
  opt.max_steps = max_steps;
  opt.on_step = [out](const StepRecord& r) { out->records.push_back(r); };
  const auto t0 = Clock::now();
  auto r = RunTraining(cfg, backend.get(), SyntheticData(cfg, rank, world), opt);
  if (!r.ok()) return r.status();
  out->result = std::move(r).value();
  out->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  FORGE_RETURN_IF_ERROR(backend->GetParams(&out->w));
  return backend->GetMoments(&out->m, &out->v);
}

// How many elements differ at all, and the largest difference relative to the reference
// unit's largest magnitude.
struct Diff {
  int64_t differing = 0, total = 0;
  double max_rel = 0;
  void Add(const std::vector<float>& got, const std::vector<float>& want) {
    float scale = 0;
    for (float x : want) scale = std::max(scale, std::fabs(x));
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
      ++total;
      if (std::memcmp(&got[i], &want[i], 4) != 0) {
        ++differing;
        max_rel = std::max(max_rel, std::fabs(double(got[i]) - want[i]) / std::max(scale, 1e-30f));
      }
    }
    if (got.size() != want.size()) differing += int64_t(std::max(got.size(), want.size()));
  }
  void Add(const UnitBuffers& got, const UnitBuffers& want) {
    if (got.size() != want.size()) differing += 1;
    for (size_t u = 0; u < want.size() && u < got.size(); ++u) Add(got[u], want[u]);
  }
  std::string Text() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%ld/%ld differ (max rel %.2e)", long(differing), long(total),
                  max_rel);
    return buf;
  }
};

std::vector<std::string> Modes(int argc, char** argv) {
  const std::string list = ArgValue(argc, argv, "--modes", "ddp,zero1,zero2,fsdp");
  std::vector<std::string> out;
  for (size_t pos = 0; pos < list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    out.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

bool ParseMode(const std::string& name, ParallelMode* mode) {
  for (ParallelMode m :
       {ParallelMode::kDdp, ParallelMode::kZero1, ParallelMode::kZero2, ParallelMode::kFsdp}) {
    if (name == ParallelModeName(m)) {
      *mode = m;
      return true;
    }
  }
  return false;
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
    if (!ParseMode(mode, &cfg.parallel.mode)) {
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
    c.Expect(m->world_size == W && m->parallel_mode == mode && int(m->shards.size()) == W,
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
    if (!ParseMode(mode, &cfg.parallel.mode)) {
      c.Expect(false, "unknown mode " + mode);
      continue;
    }
    const std::string source = rotate ? Rotated(mode) : mode;
    cfg.checkpoint.resume = StepDir(from + "/" + source, steps);
    cfg.checkpoint.dir = root + "/" + mode;
    Outcome got;
    Status st = Train(cfg, comm, -1, &got);
    if (!st.ok()) comm->Abort(st.Annotate("resume, mode " + mode));
    if (rank != 0) continue;

    Diff curve, weights, moments, saved;
    std::vector<float> want_loss, want_norm, want_val, got_loss, got_norm, got_val;
    for (const StepRecord& r : ref.records) {
      if (r.step <= steps) continue;
      want_loss.push_back(r.loss);
      want_norm.push_back(r.grad_norm);
      want_val.push_back(r.val_loss);
    }
    for (const StepRecord& r : got.records) {
      got_loss.push_back(r.loss);
      got_norm.push_back(r.grad_norm);
      got_val.push_back(r.val_loss);
    }
    curve.Add(got_loss, want_loss);
    curve.Add(got_norm, want_norm);
    curve.Add(got_val, want_val);
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
  if (argc < 2) {
    std::fprintf(stderr, "usage: forge_checkpoint_check save|resume [flags]\n");
    return 2;
  }
  const std::string cmd = argv[1];
  Status st = InitMpi();
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  MpiCommOptions o;
  o.timeout_s = 120;
  auto comm = MakeMpiComm(o);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  int failures = 0;
  if (cmd == "save") {
    failures = RunSave(comm->get(), argc, argv);
  } else if (cmd == "resume") {
    failures = RunResume(comm->get(), argc, argv);
  } else {
    std::fprintf(stderr, "unknown check %s\n", cmd.c_str());
    failures = 1;
  }
  // Everyone agrees on the verdict before rank 0 prints it.
  double f = failures;
  st = AllReduceSumBlocking(comm->get(), &f, 1, DType::kF64, "verdict");
  if (!st.ok()) (*comm)->Abort(st);
  if ((*comm)->rank() == 0 && f == 0) std::printf("CHECKPOINT_CHECK OK\n");
  comm->reset();
  FinalizeMpi();
  return f == 0 ? 0 : 1;
}
