// forge_parallel_check: data-parallel checks that need several processes. The integration
// tests (tests/integration/parallel_mpi_test.cc) launch it under mpirun:
//
//   forge_parallel_check comm
//       MpiComm semantics on every rank: canonical sums bitwise equal to CanonicalSum of the
//       ranks' inputs (rebuilt locally), in-place variants, bf16 moves, Split (sub-communicators
//       ranked by key, their sums canonical over their own ranks), many collectives in
//       flight waited in reverse order, MPI's own sums within float tolerance, argument errors,
//       the MPI rendezvous for NCCL ids.
//   forge_parallel_check trajectory [--global G] [--micro B] [--steps K]
//                                   [--modes ddp,zero1,zero2,fsdp,hsdp2]
//                                   [--expect bitwise|close]
//                                   [--native-sums]
//       Trains a tiny model K steps in each mode over all ranks and compares the per-step loss,
//       grad norm and val loss, and the final weights and AdamW moments, with one process
//       (computed on rank 0 with no communicator) on the same global batch; hsdpG (hsdp with
//       shard groups of G ranks) also checks that every replica group ends with bitwise the
//       same weights and moments. --native-sums
//       uses MPI's own reductions instead of the canonical order (to measure the difference).
//   forge_parallel_check executor
//       ModeExecutor (worker/parallel/mode_executor.h) over host buffers in ddp, zero1, fsdp
//       and, on 4 ranks, hsdp with shard groups of 2: each unit's gradient sum (all-reduced,
//       reduce-scattered into the slot, hsdp's two-level sum) bitwise the canonical sum of the
//       ranks' inputs rebuilt locally, the storage hooks called in order (the replica hand-over
//       only on a last micro-step), the owned ranges tiling each unit, the norm's comm, and the
//       gathers (after the update in zero1 only; of any slots in every sharded mode).
//   forge_parallel_check hang --timeout S [--unwaited]
//       Rank 1 skips an all-reduce the others start. Rank 0 waits for it (or, with --unwaited,
//       never does): the comm's timeout must name the rank and the collective and the job must
//       end (MPI_Abort) instead of hanging.
//
// Rank 0 prints one line per check and "PARALLEL_CHECK OK" when everything held; the exit
// status is non-zero otherwise.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "driver_util.h"
#include "worker/model/shard_layout.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/hybrid_groups.h"
#include "worker/parallel/mode_executor.h"
#include "worker/parallel/mode_rules.h"
#include "worker/parallel/mpi_comm.h"
#include "worker/parallel/rendezvous.h"
#include "worker/parallel/sum_order.h"

namespace forge {
namespace {

using check::ArgValue;
using check::Checker;
using check::Diff;
using check::HasFlag;
using check::Outcome;
using Clock = std::chrono::steady_clock;

uint64_t Mix(uint64_t x) {  // SplitMix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A float in [-1, 1] times 2^-(0..15): varied exponents make reassociation visible.
float Value(uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t h = Mix(a * 0x1000003 + Mix(b * 0x10001 + Mix(c)));
  const double unit = double(h >> 11) / double(1ull << 53) * 2.0 - 1.0;
  return static_cast<float>(std::ldexp(unit, -int((h >> 3) % 16)));
}

// ----------------------------------------------------------------------------------------
// comm

template <typename T>
bool SameBits(const T* a, const T* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, size_t(n) * sizeof(T)) == 0;
}

// The canonical sum of every rank's input, rebuilt locally.
template <typename T>
std::vector<T> ExpectedSum(int world, int64_t n, uint64_t tag) {
  std::vector<std::vector<T>> in(world, std::vector<T>(n));
  std::vector<T*> parts(world);
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < n; ++i) in[r][i] = T(Value(tag, r, i));
    parts[r] = in[r].data();
  }
  std::vector<T> out(n);
  CanonicalSum(out.data(), parts.data(), world, n);
  return out;
}

int RunComm(Comm* comm, Comm* native) {
  const int rank = comm->rank(), W = comm->world();
  Checker c{rank};
  const int64_t sizes[] = {1, 5, 33, 1000, 4097};
  for (int64_t n : sizes) {
    const std::string at = " (n=" + std::to_string(n) + ")";
    // all-reduce, f32 and f64
    {
      std::vector<float> buf(n);
      for (int64_t i = 0; i < n; ++i) buf[i] = Value(1, rank, i);
      c.Ok(AllReduceSumBlocking(comm, buf.data(), n, DType::kF32, "f32"), "all_reduce f32" + at);
      auto want = ExpectedSum<float>(W, n, 1);
      c.Expect(SameBits(buf.data(), want.data(), n), "all_reduce f32 bitwise canonical" + at);
    }
    {
      std::vector<double> buf(n);
      for (int64_t i = 0; i < n; ++i) buf[i] = Value(2, rank, i);
      c.Ok(AllReduceSumBlocking(comm, buf.data(), n, DType::kF64, "f64"), "all_reduce f64" + at);
      auto want = ExpectedSum<double>(W, n, 2);
      c.Expect(SameBits(buf.data(), want.data(), n), "all_reduce f64 bitwise canonical" + at);
    }
    // reduce-scatter, out of place and in place (recv = send + rank*n)
    for (int in_place = 0; in_place < 2; ++in_place) {
      std::vector<float> send(W * n), recv(n);
      for (int64_t i = 0; i < W * n; ++i) send[i] = Value(3, rank, i);
      float* out = in_place ? send.data() + rank * n : recv.data();
      auto w = comm->ReduceScatterSum(send.data(), out, n, DType::kF32, "rs");
      c.Ok(w.ok() ? (*w)->Wait() : w.status(), "reduce_scatter" + at);
      auto full = ExpectedSum<float>(W, W * n, 3);
      c.Expect(
          SameBits(out, full.data() + rank * n, n),
          std::string("reduce_scatter bitwise canonical") + (in_place ? " in place" : "") + at);
    }
    // all-gather f32 (out of place, in place) and bf16
    for (int in_place = 0; in_place < 2; ++in_place) {
      std::vector<float> recv(W * n, -1.0f), send(n);
      for (int64_t i = 0; i < n; ++i) send[i] = Value(4, rank, i);
      const float* src = send.data();
      if (in_place) {
        std::copy(send.begin(), send.end(), recv.begin() + rank * n);
        src = recv.data() + rank * n;
      }
      c.Ok(AllGatherBlocking(comm, src, recv.data(), n, DType::kF32, "ag"), "all_gather" + at);
      bool ok = true;
      for (int r = 0; r < W; ++r)
        for (int64_t i = 0; i < n; ++i) ok &= recv[r * n + i] == Value(4, r, i);
      c.Expect(ok, std::string("all_gather content") + (in_place ? " in place" : "") + at);
    }
    {
      std::vector<uint16_t> send(n), recv(W * n);
      for (int64_t i = 0; i < n; ++i) send[i] = uint16_t(rank * 1000 + i);
      c.Ok(AllGatherBlocking(comm, send.data(), recv.data(), n, DType::kBF16, "bf16"),
           "all_gather bf16" + at);
      bool ok = true;
      for (int r = 0; r < W; ++r)
        for (int64_t i = 0; i < n; ++i) ok &= recv[r * n + i] == uint16_t(r * 1000 + i);
      c.Expect(ok, "all_gather bf16 content" + at);
    }
    // broadcast from the last rank
    {
      std::vector<float> buf(n);
      for (int64_t i = 0; i < n; ++i) buf[i] = Value(5, rank, i);
      c.Ok(BroadcastBlocking(comm, buf.data(), n, DType::kF32, W - 1, "bcast"), "broadcast" + at);
      bool ok = true;
      for (int64_t i = 0; i < n; ++i) ok &= buf[i] == Value(5, W - 1, i);
      c.Expect(ok, "broadcast content" + at);
    }
    // MPI's own sum: right up to float reassociation
    {
      std::vector<float> buf(n);
      for (int64_t i = 0; i < n; ++i) buf[i] = Value(1, rank, i);
      c.Ok(AllReduceSumBlocking(native, buf.data(), n, DType::kF32, "native"),
           "native all_reduce" + at);
      auto want = ExpectedSum<float>(W, n, 1);
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(double(buf[i]) - want[i]));
      c.Expect(worst <= 1e-6 * W, "native all_reduce close to canonical" + at);
    }
  }
  // Many all-reduces in flight, waited in reverse order: second stages must still start in
  // issue order on every rank (else the all-gathers would mismatch and hang or mix data).
  {
    const int kOps = 6;
    std::vector<std::vector<float>> bufs(kOps);
    std::vector<CommWorkPtr> works;
    for (int k = 0; k < kOps; ++k) {
      const int64_t n = 100 + 517 * k;
      bufs[k].resize(n);
      for (int64_t i = 0; i < n; ++i) bufs[k][i] = Value(10 + k, rank, i);
      auto w = comm->AllReduceSum(bufs[k].data(), n, DType::kF32, "in flight " + std::to_string(k));
      c.Ok(w.status(), "start in-flight all_reduce");
      if (w.ok()) works.push_back(std::move(w).value());
    }
    for (int k = int(works.size()) - 1; k >= 0; --k) c.Ok(works[k]->Wait(), "wait in flight");
    for (int k = 0; k < int(works.size()); ++k) {
      auto want = ExpectedSum<float>(W, int64_t(bufs[k].size()), 10 + k);
      c.Expect(SameBits(bufs[k].data(), want.data(), int64_t(want.size())),
               "in-flight all_reduce " + std::to_string(k));
    }
    auto b = comm->Barrier("ready check");
    c.Ok(b.status(), "barrier");
    if (b.ok()) {
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (!(*b)->Ready() && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      c.Expect((*b)->Ready(), "barrier Ready() turns true");
      c.Ok((*b)->Wait(), "barrier wait");
    }
  }
  // Split: ranks of the same parity form a comm, ordered by key = -rank (reversed). Its sums
  // are the canonical sum over its own ranks in key order; a collective of the parent started
  // before the part's and waited after it is unaffected (the part's collectives are its own),
  // and so is one in flight when the split starts.
  {
    // An all-reduce in flight when the split starts (its second stage may not have started on
    // every rank): the split lets it finish first.
    std::vector<float> before(3001);
    for (int64_t i = 0; i < 3001; ++i) before[i] = Value(22, rank, i);
    auto wb = comm->AllReduceSum(before.data(), 3001, DType::kF32, "before split");
    c.Ok(wb.status(), "all_reduce before split");
    auto part = comm->Split(rank % 2, -rank, "parity");
    c.Ok(part.status(), "split");
    if (wb.ok()) {
      c.Ok((*wb)->Wait(), "all_reduce before split: wait");
      auto want = ExpectedSum<float>(W, 3001, 22);
      c.Expect(SameBits(before.data(), want.data(), 3001), "all_reduce in flight across a split");
    }
    if (part.ok()) {
      std::vector<int> members;  // world ranks of this part, in its rank order
      for (int r = W - 1; r >= 0; --r)
        if (r % 2 == rank % 2) members.push_back(r);
      Comm* p = part->get();
      c.Expect(p->world() == int(members.size()), "split: part size");
      c.Expect(members[size_t(p->rank())] == rank, "split: ranked by key");
      const int64_t n = 777;
      std::vector<float> outer(n), inner(n);
      for (int64_t i = 0; i < n; ++i) {
        outer[i] = Value(20, rank, i);
        inner[i] = Value(21, rank, i);
      }
      auto wo = comm->AllReduceSum(outer.data(), n, DType::kF32, "parent during split");
      c.Ok(wo.status(), "parent all_reduce");
      c.Ok(AllReduceSumBlocking(p, inner.data(), n, DType::kF32, "part"), "part all_reduce");
      if (wo.ok()) c.Ok((*wo)->Wait(), "parent all_reduce wait");
      std::vector<std::vector<float>> in(members.size(), std::vector<float>(n));
      std::vector<float*> parts;
      for (size_t q = 0; q < members.size(); ++q) {
        for (int64_t i = 0; i < n; ++i) in[q][i] = Value(21, members[q], i);
        parts.push_back(in[q].data());
      }
      std::vector<float> want(n);
      CanonicalSum(want.data(), parts.data(), int(parts.size()), n);
      c.Expect(SameBits(inner.data(), want.data(), n), "split: part all_reduce bitwise canonical");
      auto outer_want = ExpectedSum<float>(W, n, 20);
      c.Expect(SameBits(outer.data(), outer_want.data(), n), "split: parent all_reduce intact");
    }
    c.Expect(!comm->Split(-1, 0, "negative").ok(), "split: negative color rejected");
  }
  // The MPI rendezvous hands rank 0's NCCL id bytes to everyone.
  {
    UniqueIdBytes id{};
    for (int i = 0; i < 128; ++i) id[i] = rank == 0 ? char(i * 3 + 1) : 0;
    c.Ok(MakeMpiRendezvous()->Exchange(rank, W, &id), "MPI rendezvous");
    bool ok = true;
    for (int i = 0; i < 128; ++i) ok &= id[i] == char(i * 3 + 1);
    c.Expect(ok, "MPI rendezvous bytes");
  }
  // Argument errors are errors, not crashes (and leave the comm usable).
  {
    uint16_t x = 0;
    c.Expect(!comm->AllReduceSum(&x, 1, DType::kBF16, "bf16 sum").ok(), "bf16 sum rejected");
    float y = 0;
    c.Expect(!comm->Broadcast(&y, 1, DType::kF32, W, "bad root").ok(), "bad root rejected");
    c.Ok(BarrierBlocking(comm, "after errors"), "barrier after errors");
  }
  if (rank == 0)
    std::printf("comm: world %d: %s\n", W, c.failures ? "FAILED" : "all collectives as specified");
  return c.failures;
}

// ----------------------------------------------------------------------------------------
// executor

// ModeExecutor's storage over host vectors (the CPU backend's shapes), logging its hooks.
struct HostStorage final : ModeStorage {
  std::vector<std::vector<float>> grad, slot, params;
  std::string log;

  StatusOr<GradBuffers> GradToReduce(int u, CollectiveOp op) override {
    log += op == CollectiveOp::kAllReduce ? "all_reduce" : "reduce_scatter";
    return GradBuffers{grad[u].data(), slot[u].data(), DType::kF32};
  }
  Status GradReduced(int, CollectiveOp, CommWork*) override {
    log += " reduced";
    return Status::Ok();
  }
  StatusOr<float*> HandOverToReplicas(int u, CollectiveOp op, CommWork* work) override {
    log += " replicas";
    FORGE_RETURN_IF_ERROR(work->Wait());
    return op == CollectiveOp::kAllReduce ? grad[u].data() : slot[u].data();
  }
  Status GradDone(int) override {
    log += " done;";
    return Status::Ok();
  }
  void* ParamsToGather(int u, DType* dtype) override {
    log += "gather;";
    *dtype = DType::kF32;
    return params[u].data();
  }
};

// The canonical sum over `groups` (in order) of each group's canonical sum over its ranks of
// Value(tag, rank, i) for i < numel, zero up to n.
std::vector<float> GroupedSum(const std::vector<std::vector<int>>& groups, int64_t numel,
                              int64_t n, uint64_t tag) {
  std::vector<std::vector<float>> partial;
  for (const std::vector<int>& ranks : groups) {
    std::vector<std::vector<float>> in(ranks.size(), std::vector<float>(n, 0.0f));
    std::vector<float*> parts;
    for (size_t k = 0; k < ranks.size(); ++k) {
      for (int64_t i = 0; i < numel; ++i) in[k][i] = Value(tag, ranks[k], i);
      parts.push_back(in[k].data());
    }
    partial.emplace_back(n);
    CanonicalSum(partial.back().data(), parts.data(), int(parts.size()), n);
  }
  std::vector<float*> parts;
  for (auto& p : partial) parts.push_back(p.data());
  std::vector<float> out(n);
  CanonicalSum(out.data(), parts.data(), int(parts.size()), n);
  return out;
}

int RunExecutor(Comm* comm) {
  const int rank = comm->rank(), W = comm->world();
  Checker c{rank};
  std::vector<std::string> modes = {"ddp", "zero1", "fsdp"};
  if (W == 4) modes.push_back("hsdp2");
  const std::vector<int64_t> sizes = {5, 33, 1000};
  std::vector<ModeUnit> units;
  for (size_t u = 0; u < sizes.size(); ++u) units.push_back({"u" + std::to_string(u), sizes[u]});
  const int U = int(units.size());

  for (const std::string& mode : modes) {
    ParallelConfig p;
    check::ParseMode(mode, &p);
    const ModeRules rules = ModeRulesFor(p, W);
    HybridComms hybrid;
    Comm* shard = comm;
    if (rules.reduce_over_replicas) {
      auto split = SplitHybridComms(comm, p.shard_group_size);
      if (!split.ok()) comm->Abort(split.status());
      hybrid = std::move(split).value();
      shard = hybrid.shard.get();
    }
    const int G = shard->world(), R = W / G, j = shard->rank(), i = rank / G;
    // Shard groups in replica order: the two-level sum's order (hybrid_groups.h).
    std::vector<std::vector<int>> groups(R);
    for (int g = 0; g < R; ++g)
      for (int k = 0; k < G; ++k) groups[g].push_back(g * G + k);
    const ModeExecutor exec(rules, shard, hybrid.replica.get(), units);
    const std::string at = " (" + mode + ")";
    c.Expect(exec.norm_comm() == (rules.sharded() ? shard : nullptr), "norm comm" + at);

    // Gradients: a step's last micro-step, a micro-step before it, and every rank wanting the
    // whole gradient.
    for (int pass = 0; pass < 3; ++pass) {
      const GradPass gp{.all_reduce = pass == 2, .last_micro = pass != 1};
      HostStorage s;
      for (int u = 0; u < U; ++u) {
        const int64_t n = rules.sharded() ? PaddedSize(sizes[u], G) : sizes[u];
        s.grad.emplace_back(n, 0.0f);
        for (int64_t e = 0; e < sizes[u]; ++e) s.grad[u][e] = Value(30 + u, rank, e);
        s.slot.emplace_back(exec.slot(u), -1.0f);
      }
      PendingWork pending;
      for (int u = U - 1; u >= 0; --u)
        c.Ok(exec.ReduceGrad(u, gp, &s, &pending), "ReduceGrad" + at);
      c.Ok(WaitAll(&pending), "wait" + at);
      const bool rs = rules.sharded() && !gp.all_reduce;
      const bool replicas = rules.reduce_over_replicas && gp.last_micro;
      std::string want;
      for (int u = 0; u < U; ++u)
        want += std::string(rs ? "reduce_scatter" : "all_reduce") + " reduced" +
                (replicas ? " replicas" : "") + " done;";
      c.Expect(s.log == want, "hooks in order" + at + ": " + s.log);
      for (int u = U - 1; u >= 0; --u) {
        const int64_t n = int64_t(s.grad[u].size());
        // The shard group's sum, or (hsdp's last micro-step) the sum over every group.
        const std::vector<float> sum =
            replicas ? GroupedSum(groups, sizes[u], n, 30 + u)
                     : GroupedSum({groups[i]}, sizes[u], n, 30 + u);
        const float* got = rs ? s.slot[u].data() : s.grad[u].data();
        const float* expect = rs ? sum.data() + j * exec.slot(u) : sum.data();
        c.Expect(SameBits(got, expect, rs ? exec.slot(u) : sizes[u]),
                 "unit " + units[u].name + " pass " + std::to_string(pass) +
                     " bitwise the canonical sum" + at);
      }
    }

    // Owned ranges: whole units in ddp, else the shard group's ranks tile each unit.
    for (int u = 0; u < U; ++u) {
      const ShardRange own = exec.owned(u);
      double size = double(own.size());
      c.Ok(AllReduceSumBlocking(shard, &size, 1, DType::kF64, "owned"), "owned sum" + at);
      const double copies = rules.sharded() ? 1.0 : double(G);
      const int64_t begin = rules.sharded() ? std::min(sizes[u], j * exec.slot(u)) : 0;
      c.Expect(size == copies * double(sizes[u]) && own.begin == begin,
               "owned ranges tile unit " + units[u].name + at);
    }

    if (rank == 0) std::printf("executor world=%d mode=%s: checked\n", W, mode.c_str());

    // Gathers: after the update (zero1, zero2 only), and of any slots (sharded modes).
    if (!rules.sharded()) continue;
    HostStorage s;
    PendingWork pending;
    std::vector<std::vector<float>> mine(U), full(U);
    for (int u = 0; u < U; ++u) {
      const int64_t slot = exec.slot(u);
      s.params.emplace_back(G * slot, -1.0f);
      full[u].assign(G * slot, -1.0f);
      for (int64_t e = 0; e < slot; ++e) {
        s.params[u][j * slot + e] = Value(40 + u, j, e);
        mine[u].push_back(Value(50 + u, j, e));
      }
      c.Ok(exec.GatherAfterUpdate(u, &s, &pending), "GatherAfterUpdate" + at);
      c.Ok(exec.GatherShards(u, mine[u].data(), full[u].data(), DType::kF32, "gather", &pending),
           "GatherShards" + at);
    }
    c.Ok(WaitAll(&pending), "wait gathers" + at);
    c.Expect(s.log == (rules.gather_after_update ? "gather;gather;gather;" : ""),
             "gathers after the update in zero only" + at + ": " + s.log);
    for (int u = 0; u < U; ++u) {
      bool ok = true;
      for (int r = 0; r < G; ++r)
        for (int64_t e = 0; e < exec.slot(u); ++e) {
          ok &= full[u][r * exec.slot(u) + e] == Value(50 + u, r, e);
          if (rules.gather_after_update)
            ok &= s.params[u][r * exec.slot(u) + e] == Value(40 + u, r, e);
        }
      c.Expect(ok, "gathered unit " + units[u].name + at);
    }
  }
  return c.failures;
}

// ----------------------------------------------------------------------------------------
// trajectory

// Single sequences or micro-batches of `micro`, as the test case asks.
RunConfig TinyConfig(int64_t global, int micro, int steps) {
  return check::TinyConfig(7, global, micro, steps);
}

int RunTrajectory(Comm* comm, int argc, char** argv) {
  const int rank = comm->rank(), W = comm->world();
  Checker c{rank};
  const int64_t global = std::atoll(ArgValue(argc, argv, "--global", "8").c_str());
  const int micro = std::atoi(ArgValue(argc, argv, "--micro", "1").c_str());
  const int steps = std::atoi(ArgValue(argc, argv, "--steps", "5").c_str());
  const auto modes = check::SplitModes(ArgValue(argc, argv, "--modes", "ddp,zero1,zero2,fsdp"));
  const bool bitwise = ArgValue(argc, argv, "--expect", "bitwise") == "bitwise";
  // "close" (worlds where the canonical order cannot match one process: W not a power of two
  // with several micro-steps per rank, or MPI's own sums): loss, grad norm and val loss within
  // 1e-6 relative; weights and moments within 1e-4 of their unit's largest magnitude. Why not
  // 1e-6 for weights too: AdamW divides by sqrt(v), so a last-bit change in a gradient element
  // near zero moves that element's update by a visible fraction of lr; measured after 5-20
  // steps of this config: <= 8e-6 (weights), <= 5e-6 (moments), <= 3e-7 (losses).
  const double curve_tol = 1e-6, state_tol = 1e-4;

  const RunConfig base = TinyConfig(global, micro, steps);
  Outcome ref;
  if (rank == 0) c.Ok(check::Train(base, Mix, nullptr, -1, &ref), "single-process reference");

  for (const std::string& mode : modes) {
    RunConfig cfg = base;
    if (!check::ParseMode(mode, &cfg.parallel)) {
      c.Expect(false, "unknown mode " + mode);
      continue;
    }
    Outcome got;
    Status st = check::Train(cfg, Mix, comm, -1, &got);
    if (!st.ok()) comm->Abort(st.Annotate("mode " + mode));  // other ranks may be mid-collective
    // hsdp: every replica group ends with bitwise the same state. Each rank's w, m, v are its
    // shard group's (gathered there); rank 0's go to everyone, and every rank compares.
    int replicas_differing = 0;
    if (cfg.parallel.mode == ParallelMode::kHsdp) {
      int mine = 0;
      for (UnitBuffers* b : {&got.w, &got.m, &got.v})
        for (std::vector<float>& unit : *b) {
          std::vector<float> root = unit;
          c.Ok(BroadcastBlocking(comm, root.data(), int64_t(root.size()), DType::kF32, 0,
                                 "replica check"),
               "broadcast rank 0's state");
          mine += !SameBits(root.data(), unit.data(), int64_t(unit.size()));
        }
      double n = mine;
      c.Ok(AllReduceSumBlocking(comm, &n, 1, DType::kF64, "replica verdict"), "replica verdict");
      replicas_differing = int(n);
      c.Expect(replicas_differing == 0,
               "mode " + mode + ": every replica group holds bitwise rank 0's group's state");
    }
    if (rank != 0) continue;

    Diff curve, weights, moments;
    curve.AddCurves(got.records, ref.records);
    weights.Add(got.w, ref.w);
    moments.Add(got.m, ref.m);
    moments.Add(got.v, ref.v);
    const int64_t accum = global / (int64_t(micro) * W);
    std::printf(
        "trajectory world=%d mode=%-5s global=%ld micro=%d (%ld micro-steps/rank), %d steps: "
        "loss/norm/val %s; weights %s; moments %s%s; %.2f s\n",
        W, mode.c_str(), long(global), micro, long(accum), steps, curve.Text().c_str(),
        weights.Text().c_str(), moments.Text().c_str(),
        cfg.parallel.mode != ParallelMode::kHsdp ? ""
        : replicas_differing == 0            ? "; replicas bitwise equal"
                                             : "; REPLICAS DIFFER",
        got.seconds);
    c.Expect(int(got.records.size()) == steps, "one record per step");
    if (bitwise) {
      c.Expect(curve.differing == 0 && weights.differing == 0 && moments.differing == 0,
               "mode " + mode + ": bitwise equal to one process");
    } else {
      c.Expect(curve.max_rel <= curve_tol && weights.max_rel <= state_tol &&
                   moments.max_rel <= state_tol,
               "mode " + mode + ": within tolerance of one process");
    }
  }
  return c.failures;
}

// ----------------------------------------------------------------------------------------
// hang

int RunHang(Comm* comm, bool unwaited) {
  const int rank = comm->rank();
  std::vector<float> buf(1024, 1.0f);
  Status st = AllReduceSumBlocking(comm, buf.data(), 1024, DType::kF32, "warm-up");
  if (!st.ok()) comm->Abort(st);
  const auto t0 = Clock::now();
  if (rank == 1) {  // the faulty rank: never joins (e.g. stuck in a data loader)
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 1;
  }
  auto w = comm->AllReduceSum(buf.data(), 1024, DType::kF32, "hang test");
  if (!w.ok()) comm->Abort(w.status());
  if (unwaited) {  // nobody will ever Wait: the watchdog has to end the job
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return 1;
  }
  st = (*w)->Wait();
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  if (st.ok()) {
    std::fprintf(stderr, "rank %d: the skipped all-reduce completed?!\n", rank);
    return 1;
  }
  std::fprintf(stderr, "rank %d: Wait() returned the error after %.2f s\n", rank, waited);
  comm->Abort(st);
  return 1;  // not reached
}

}  // namespace
}  // namespace forge

int main(int argc, char** argv) {
  using namespace forge;
  return check::MpiCheckMain(
      argc, argv, "forge_parallel_check comm|executor|trajectory|hang [flags]", "PARALLEL_CHECK OK",
      [argc, argv](const std::string& cmd) {
        MpiCommOptions o;
        o.timeout_s = 120;
        if (cmd == "hang") {
          o.timeout_s = std::atof(ArgValue(argc, argv, "--timeout", "1").c_str());
          o.abort_grace_s = 1.0;
        }
        return o;
      },
      [argc, argv](const std::string& cmd, Comm* comm, const MpiCommOptions& o) {
        // The same world with MPI's own reductions instead of the canonical order.
        auto native_comm = [&]() {
          MpiCommOptions n = o;
          n.canonical_sums = false;
          auto made = MakeMpiComm(n);
          if (!made.ok()) comm->Abort(made.status());
          return std::move(made).value();
        };
        if (cmd == "comm") return RunComm(comm, native_comm().get());
        if (cmd == "executor") return RunExecutor(comm);
        if (cmd == "trajectory") {
          std::unique_ptr<Comm> native;
          if (HasFlag(argc, argv, "--native-sums")) native = native_comm();
          return RunTrajectory(native ? native.get() : comm, argc, argv);
        }
        if (cmd == "hang") return RunHang(comm, HasFlag(argc, argv, "--unwaited"));
        std::fprintf(stderr, "unknown check %s\n", cmd.c_str());
        return 1;
      });
}
