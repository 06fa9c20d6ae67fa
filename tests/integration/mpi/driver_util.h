// What the mpirun check drivers (forge_parallel_check, forge_checkpoint_check) share: flag
// parsing, a failure counter, the tiny model config and its synthetic data, a training run
// that keeps every step record and the final state, a bitwise/relative diff, and the MPI
// main() that agrees on one verdict across ranks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "worker/data/sampler.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/parallel/mpi_comm.h"
#include "worker/train/backend.h"
#include "worker/train/trainer.h"

namespace forge::check {

// argv[1] is the check's name; flags follow it.
inline std::string ArgValue(int argc, char** argv, const std::string& flag,
                            const std::string& def) {
  for (int i = 2; i + 1 < argc; ++i)
    if (flag == argv[i]) return argv[i + 1];
  return def;
}
inline bool HasFlag(int argc, char** argv, const std::string& flag) {
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
  void Ok(const Status& s, const std::string& what) { Expect(s.ok(), what + ": " + s.ToString()); }
};

// "ddp,zero1" -> {"ddp", "zero1"}.
inline std::vector<std::string> SplitModes(const std::string& list) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    out.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

// "fsdp" -> fsdp; "hsdp2" -> hsdp with shard groups of 2 ranks.
inline bool ParseMode(const std::string& name, ParallelConfig* p) {
  for (ParallelMode m :
       {ParallelMode::kDdp, ParallelMode::kZero1, ParallelMode::kZero2, ParallelMode::kFsdp}) {
    if (name == ParallelModeName(m)) {
      p->mode = m;
      p->shard_group_size = 0;
      return true;
    }
  }
  if (name.size() > 4 && name.rfind("hsdp", 0) == 0) {
    const int g = std::atoi(name.c_str() + 4);
    if (g < 1 || name != "hsdp" + std::to_string(g)) return false;
    p->mode = ParallelMode::kHsdp;
    p->shard_group_size = g;
    return true;
  }
  return false;
}

// 2 layers, d 32, GQA 4/2 heads, vocab 96 (padded to 128), T 16, an active grad clip (the clip
// factor depends on the global norm) and evaluation of 3 batches every 2 steps (fewer batches
// than 4 ranks: some ranks evaluate nothing).
inline RunConfig TinyConfig(uint64_t seed, int64_t global, int micro, int64_t total_steps) {
  RunConfig c;
  c.seed = seed;
  c.model.n_layer = 2;
  c.model.d_model = 32;
  c.model.n_head = 4;
  c.model.n_kv_head = 2;
  c.model.ffn = 64;
  c.model.vocab = 96;
  c.model.seq_len = 16;
  c.model.qk_norm = true;
  c.batch.micro_batch = micro;
  c.batch.global_batch = global;
  c.optimizer.lr = 1e-2f;
  c.optimizer.grad_clip = 0.5f;
  c.schedule.total_steps = total_steps;
  c.schedule.warmup_steps = 2;
  c.eval.every_steps = 2;
  c.eval.batches = 3;
  c.train.log_every = 1;
  return c;
}

// Token i of the stream is hash(i) mod vocab; each driver keeps its own hash (and so its data).
using TokenHash = uint64_t (*)(uint64_t);

// Sequence s of the training stream (val: s >= 1e6): pseudo-random tokens.
inline void FillSequence(const RunConfig& c, TokenHash hash, int64_t s, int32_t* in,
                         int32_t* tgt) {
  const int T = c.model.seq_len;
  for (int t = 0; t < T; ++t) {
    in[t] = int32_t(hash(uint64_t(s) * 1000 + t) % uint64_t(c.model.vocab));
    tgt[t] = int32_t(hash(uint64_t(s) * 1000 + t + 1) % uint64_t(c.model.vocab));
  }
}

// Rank `rank` of `world`'s slice of each global batch, laid out as the sampler does.
inline BatchProvider SyntheticData(const RunConfig& c, TokenHash hash, int rank, int world) {
  BatchProvider p;
  p.train = [c, hash, rank, world](int64_t cursor, int k, int32_t* in, int32_t* tgt) {
    const int b = c.batch.micro_batch, T = c.model.seq_len;
    const int64_t first = SliceStart(cursor, rank, world, b, k);
    for (int j = 0; j < b; ++j) FillSequence(c, hash, first + j, in + j * T, tgt + j * T);
    return Status::Ok();
  };
  p.val = [c, hash](int64_t i, int32_t* in, int32_t* tgt) {
    const int b = c.batch.micro_batch, T = c.model.seq_len;
    for (int j = 0; j < b; ++j)
      FillSequence(c, hash, 1'000'000 + i * b + j, in + j * T, tgt + j * T);
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

// Trains on the CPU backend over `comm` (nullptr: one process) up to max_steps (< 0: the
// schedule's end), keeping every step record and the final weights and moments.
inline Status Train(const RunConfig& cfg, TokenHash hash, Comm* comm, int64_t max_steps,
                    Outcome* out) {
  using Clock = std::chrono::steady_clock;
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->world() : 1;
  auto backend = MakeCpuBackend(cfg, comm);
  TrainOptions opt;
  opt.print_progress = false;
  opt.comm = comm;
  opt.max_steps = max_steps;
  opt.on_step = [out](const StepRecord& r) { out->records.push_back(r); };
  const auto t0 = Clock::now();
  // hsdp ranks read the micro-steps of their data position (hybrid_groups.h), as forge train's
  // ranks do.
  auto r = RunTraining(cfg, backend.get(),
                       SyntheticData(cfg, hash, DataRank(cfg.parallel, rank, world), world), opt);
  if (!r.ok()) return r.status();
  out->result = std::move(r).value();
  out->seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  FORGE_RETURN_IF_ERROR(backend->GetParams(&out->w));
  return backend->GetMoments(&out->m, &out->v);
}

// Differences between two equally shaped float sets: how many elements differ at all, and the
// largest difference relative to the reference unit's largest magnitude.
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
  // The loss, grad norm and val loss of got's records against want's records after
  // `after_step` (got's records all count).
  void AddCurves(const std::vector<StepRecord>& got, const std::vector<StepRecord>& want,
                 int64_t after_step = -1) {
    std::vector<float> want_loss, want_norm, want_val, got_loss, got_norm, got_val;
    for (const StepRecord& r : want) {
      if (r.step <= after_step) continue;
      want_loss.push_back(r.loss);
      want_norm.push_back(r.grad_norm);
      want_val.push_back(r.val_loss);
    }
    for (const StepRecord& r : got) {
      got_loss.push_back(r.loss);
      got_norm.push_back(r.grad_norm);
      got_val.push_back(r.val_loss);
    }
    Add(got_loss, want_loss);
    Add(got_norm, want_norm);
    Add(got_val, want_val);
  }
  std::string Text() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%ld/%ld differ (max rel %.2e)", long(differing), long(total),
                  max_rel);
    return buf;
  }
};

// main() of a check driver: MPI up, one MpiComm with options(cmd), run(cmd, comm, options)
// on every rank (its failure count; it reports an unknown cmd itself), then every rank agrees
// on the total before rank 0 prints ok_line. Exit status 0 only when nothing failed anywhere.
inline int MpiCheckMain(
    int argc, char** argv, const char* usage, const char* ok_line,
    const std::function<MpiCommOptions(const std::string& cmd)>& options,
    const std::function<int(const std::string& cmd, Comm* comm, const MpiCommOptions& o)>& run) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  const std::string cmd = argv[1];
  Status st = InitMpi();
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  const MpiCommOptions o = options(cmd);
  auto comm = MakeMpiComm(o);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 1;
  }
  const int failures = run(cmd, comm->get(), o);
  double f = failures;
  st = AllReduceSumBlocking(comm->get(), &f, 1, DType::kF64, "verdict");
  if (!st.ok()) (*comm)->Abort(st);
  if ((*comm)->rank() == 0 && f == 0) std::printf("%s\n", ok_line);
  comm->reset();
  FinalizeMpi();
  return f == 0 ? 0 : 1;
}

}  // namespace forge::check
