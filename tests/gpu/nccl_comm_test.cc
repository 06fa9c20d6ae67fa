// NcclComm on several GPUs of one machine: one thread per rank, each with its own device, the
// unique id handed over by an in-process IdRendezvous (the same hook MPI / TCP / the
// coordinator plug into). Checks every collective against host arithmetic, stream ordering
// (SetProducerStream, WaitOnStream), and that a collective one rank skips times out with an
// error naming the rank and the collective instead of hanging; Split's parts. Skips below 2
// GPUs.
#include "worker/parallel/nccl_comm.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl_test_util.h"
#include "worker/model/shard_layout.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

uint16_t Bf16Bits(float f) {  // exact for the small integers used here
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return uint16_t(b >> 16);
}
float FromBf16(uint16_t h) {
  const uint32_t b = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

template <typename T>
struct Dev {
  T* p = nullptr;
  explicit Dev(size_t n) { cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)); }
  ~Dev() { cudaFree(p); }
  void Put(const std::vector<T>& h) {
    cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> Get(size_t n) {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

void CheckCollectives(int r, NcclComm* comm, Errors* e) {
  const int W = comm->world();
  e->Check(r, comm->rank() == r && comm->device() == r, "rank/device");
  for (int64_t n : {int64_t{1}, int64_t{1003}, int64_t{65536 + 5}}) {
    const std::string at = " (n=" + std::to_string(n) + ")";
    {  // f32 all-reduce: NCCL's order is its own, so compare with tolerance
      std::vector<float> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = Value(r, i);
      Dev<float> d(n);
      d.Put(h);
      e->Ok(r, Finish(comm->AllReduceSum(d.p, n, DType::kF32, "f32")), "all_reduce f32" + at);
      const auto got = d.Get(n);
      double worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int q = 0; q < W; ++q) want += Value(q, i);
        worst = std::max(worst, std::fabs(got[i] - want));
      }
      e->Check(r, worst <= 1e-5, "all_reduce f32 values" + at + " worst " + std::to_string(worst));
    }
    {  // bf16 all-reduce of small integers: exact
      std::vector<uint16_t> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = Bf16Bits(float(r + 1 + i % 7));
      Dev<uint16_t> d(n);
      d.Put(h);
      e->Ok(r, Finish(comm->AllReduceSum(d.p, n, DType::kBF16, "bf16")), "all_reduce bf16" + at);
      const auto got = d.Get(n);
      bool ok = true;
      for (int64_t i = 0; i < n; ++i)
        ok &= FromBf16(got[i]) == float(W * (W + 1) / 2 + W * (i % 7));
      e->Check(r, ok, "all_reduce bf16 values" + at);
    }
    {  // reduce-scatter, out of place and in place (recv = send + rank*n)
      for (int in_place = 0; in_place < 2; ++in_place) {
        std::vector<float> h(W * n);
        for (int64_t i = 0; i < W * n; ++i) h[i] = Value(r, i);
        Dev<float> send(W * n), recv(n);
        send.Put(h);
        float* out = in_place ? send.p + r * n : recv.p;
        e->Ok(r, Finish(comm->ReduceScatterSum(send.p, out, n, DType::kF32, "rs")),
              "reduce_scatter" + at);
        std::vector<float> got(n);
        cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost);
        double worst = 0;
        for (int64_t i = 0; i < n; ++i) {
          double want = 0;
          for (int q = 0; q < W; ++q) want += Value(q, r * n + i);
          worst = std::max(worst, std::fabs(got[i] - want));
        }
        e->Check(r, worst <= 1e-5, "reduce_scatter values" + at + (in_place ? " in place" : ""));
      }
    }
    {  // all-gather f32 (in place) and bf16 (out of place): bitwise
      std::vector<float> h(W * n, -1.0f);
      for (int64_t i = 0; i < n; ++i) h[r * n + i] = Value(r, i);
      Dev<float> d(W * n);
      d.Put(h);
      e->Ok(r, Finish(comm->AllGather(d.p + r * n, d.p, n, DType::kF32, "ag")), "all_gather" + at);
      const auto got = d.Get(W * n);
      bool ok = true;
      for (int q = 0; q < W; ++q)
        for (int64_t i = 0; i < n; ++i) ok &= got[q * n + i] == Value(q, i);
      e->Check(r, ok, "all_gather values" + at);

      std::vector<uint16_t> hb(n);
      for (int64_t i = 0; i < n; ++i) hb[i] = uint16_t(r * 3 + i);
      Dev<uint16_t> sb(n), rb(W * n);
      sb.Put(hb);
      e->Ok(r, Finish(comm->AllGather(sb.p, rb.p, n, DType::kBF16, "ag bf16")),
            "all_gather bf16" + at);
      const auto gb = rb.Get(W * n);
      ok = true;
      for (int q = 0; q < W; ++q)
        for (int64_t i = 0; i < n; ++i) ok &= gb[q * n + i] == uint16_t(q * 3 + i);
      e->Check(r, ok, "all_gather bf16 values" + at);
    }
    {  // broadcast from the last rank
      std::vector<float> h(n);
      for (int64_t i = 0; i < n; ++i) h[i] = Value(r, i);
      Dev<float> d(n);
      d.Put(h);
      e->Ok(r, Finish(comm->Broadcast(d.p, n, DType::kF32, W - 1, "bcast")), "broadcast" + at);
      const auto got = d.Get(n);
      bool ok = true;
      for (int64_t i = 0; i < n; ++i) ok &= got[i] == Value(W - 1, i);
      e->Check(r, ok, "broadcast values" + at);
    }
  }
  e->Ok(r, Finish(comm->Barrier("barrier")), "barrier");
  e->Check(r, !comm->Broadcast(nullptr, 1, DType::kF32, W, "bad root").ok(), "bad root rejected");
}

// The DDP/ZeRO pattern on streams: a producer stream writes the gradient, the collective waits
// for it device-side, a consumer stream waits for the collective device-side.
void CheckStreams(int r, NcclComm* comm, Errors* e) {
  const int W = comm->world();
  const int64_t n = 3 * 4096 + 17;  // a unit; padded to the shard layout
  const int64_t slot = ShardSize(n, W), padded = PaddedSize(n, W);
  cudaStream_t producer, consumer;
  cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking);
  std::vector<float> h(padded, 0.0f);
  for (int64_t i = 0; i < n; ++i) h[i] = float(r + 1);
  Dev<float> grad(padded), shard(slot), out(padded);
  cudaMemsetAsync(grad.p, 0, padded * sizeof(float), producer);
  cudaMemcpyAsync(grad.p, h.data(), padded * sizeof(float), cudaMemcpyHostToDevice, producer);
  comm->SetProducerStream(producer);
  auto rs = comm->ReduceScatterSum(grad.p, shard.p, slot, DType::kF32, "grad unit");
  e->Ok(r, rs.status(), "reduce_scatter on streams");
  if (!rs.ok()) return;
  e->Ok(r, (*rs)->WaitOnStream(consumer), "WaitOnStream");
  cudaMemcpyAsync(out.p + r * slot, shard.p, slot * sizeof(float), cudaMemcpyDeviceToDevice,
                  consumer);
  cudaStreamSynchronize(consumer);
  comm->SetProducerStream(consumer);
  e->Ok(r, Finish(comm->AllGather(out.p + r * slot, out.p, slot, DType::kF32, "params unit")),
        "all_gather on streams");
  comm->SetProducerStream(nullptr);
  const auto got = out.Get(padded);
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= got[i] == float(W * (W + 1) / 2);
  for (int64_t i = n; i < padded; ++i) ok &= got[i] == 0.0f;
  e->Check(r, ok, "reduce_scatter + all_gather through streams");
  cudaStreamDestroy(producer);
  cudaStreamDestroy(consumer);
}

int Devices() { return NcclVisibleDevices(); }

// Runs `body` on every rank of a world of 2 and of 4 GPUs, where there are that many, each
// failure reported with its world.
void OnTwoAndFourGpus(const std::function<void(int r, NcclComm* comm, Errors* e)>& body) {
  if (Devices() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << Devices();
  for (int world : {2, 4}) {
    if (world > Devices()) continue;
    Errors errors;
    NcclCommOptions o;
    o.timeout_s = 60;
    RunRanks(world, o, &errors, [&](int r, NcclComm* comm) { body(r, comm, &errors); });
    for (const auto& s : errors.list) ADD_FAILURE() << "world " << world << ": " << s;
  }
}

TEST(NcclComm, CollectivesOnTwoAndFourGpus) {
  OnTwoAndFourGpus([](int r, NcclComm* comm, Errors* e) {
    CheckCollectives(r, comm, e);
    CheckStreams(r, comm, e);
  });
}

// AllocSymmetric (engine.nccl_symmetric_memory): several buffers one after another (each
// registration is a group job the next call must wait for), each zeroed; f32 and bf16
// all-reduces in place on them give the sums, and a collective on plain memory still runs
// after them.
TEST(NcclComm, SymmetricMemoryIsZeroedAndCollectivesRunOnIt) {
  OnTwoAndFourGpus([](int r, NcclComm* comm, Errors* e) {
    const int world = comm->world();
    const int64_t n = (1 << 20) + 7;
    std::vector<void*> bufs;
    for (size_t bytes : {size_t(n) * 4, size_t(n) * 2, size_t(3)}) {
      auto p = comm->AllocSymmetric(bytes);
      if (!p.ok()) return e->Add(r, "AllocSymmetric: " + p.status().ToString());
      std::vector<uint8_t> h(bytes, 1);
      cudaMemcpy(h.data(), *p, bytes, cudaMemcpyDeviceToHost);
      e->Check(r, std::all_of(h.begin(), h.end(), [](uint8_t b) { return b == 0; }),
               "buffer of " + std::to_string(bytes) + " bytes zeroed");
      bufs.push_back(*p);
    }
    std::vector<float> f(n);
    std::vector<uint16_t> b(n);
    for (int64_t i = 0; i < n; ++i) {
      f[i] = Value(r, i);
      b[i] = Bf16Bits(float(r + 1 + i % 5));
    }
    cudaMemcpy(bufs[0], f.data(), n * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(bufs[1], b.data(), n * 2, cudaMemcpyHostToDevice);
    e->Ok(r, Finish(comm->AllReduceSum(bufs[0], n, DType::kF32, "symmetric f32")),
          "all_reduce f32 on symmetric memory");
    e->Ok(r, Finish(comm->AllReduceSum(bufs[1], n, DType::kBF16, "symmetric bf16")),
          "all_reduce bf16 on symmetric memory");
    cudaMemcpy(f.data(), bufs[0], n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(b.data(), bufs[1], n * 2, cudaMemcpyDeviceToHost);
    double worst = 0;
    int64_t wrong16 = 0;
    for (int64_t i = 0; i < n; ++i) {
      double want = 0, want16 = 0;
      for (int q = 0; q < world; ++q) {
        want += Value(q, i);
        want16 += q + 1 + i % 5;
      }
      worst = std::max(worst, std::fabs(f[i] - want));
      wrong16 += FromBf16(b[i]) != float(want16);  // small integers: exact
    }
    e->Check(r, worst <= 1e-5, "f32 sum worst " + std::to_string(worst));
    e->Check(r, wrong16 == 0, "bf16 sums wrong: " + std::to_string(wrong16));
    Dev<float> plain(5);
    plain.Put({1, 2, 3, 4, 5});
    e->Ok(r, Finish(comm->AllReduceSum(plain.p, 5, DType::kF32, "plain")),
          "all_reduce on plain memory after");
    e->Check(r, plain.Get(5)[4] == 5.0f * world, "plain sum");
  });
}

// Split (ncclCommSplit): ranks of the same parity form a part, ranked by key = -rank
// (reversed). Each part's all-reduce sums its own ranks' values only, the parent still sums
// everyone's afterwards, and both parts of a 4-GPU world (hsdp's 2 x 2 shape: groups {0, 2} and
// {1, 3}) work at once. On 2 GPUs each part has one rank.
TEST(NcclComm, SplitFormsIndependentPartsOnTwoAndFourGpus) {
  OnTwoAndFourGpus([](int r, NcclComm* comm, Errors* e) {
    const int world = comm->world();
    auto part = comm->SplitNccl(r % 2, -r, "parity");
    if (!part.ok()) return e->Add(r, "SplitNccl: " + part.status().ToString());
    NcclComm* p = part->get();
    std::vector<int> members;  // world ranks of this part, in its rank order
    for (int q = world - 1; q >= 0; --q)
      if (q % 2 == r % 2) members.push_back(q);
    e->Check(r, p->world() == int(members.size()), "part size");
    e->Check(r, p->rank() >= 0 && p->rank() < p->world() && members[p->rank()] == r,
             "part ranked by key");
    e->Check(r, p->device() == r, "part on the parent's device");
    const int64_t n = 4099;
    std::vector<float> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = Value(r, i);
    Dev<float> d(n), whole(n);
    d.Put(h);
    whole.Put(h);
    e->Ok(r, Finish(p->AllReduceSum(d.p, n, DType::kF32, "part")), "part all_reduce");
    e->Ok(r, Finish(comm->AllReduceSum(whole.p, n, DType::kF32, "parent")),
          "parent all_reduce after the split");
    const auto got = d.Get(n), all = whole.Get(n);
    double worst = 0, worst_all = 0;
    for (int64_t i = 0; i < n; ++i) {
      double want = 0, want_all = 0;
      for (int q : members) want += Value(q, i);
      for (int q = 0; q < world; ++q) want_all += Value(q, i);
      worst = std::max(worst, std::fabs(got[i] - want));
      worst_all = std::max(worst_all, std::fabs(all[i] - want_all));
    }
    e->Check(r, worst <= 1e-5, "part sum worst " + std::to_string(worst));
    e->Check(r, worst_all <= 1e-5, "parent sum worst " + std::to_string(worst_all));
    e->Check(r, !comm->SplitNccl(-1, 0, "negative").ok(), "negative color rejected");
  });
}

TEST(NcclComm, SkippedCollectiveTimesOutNamingRankAndCollective) {
  if (Devices() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << Devices();
  Errors errors;
  NcclCommOptions o;
  o.timeout_s = 2;
  std::promise<void> rank0_done;
  std::shared_future<void> done = rank0_done.get_future().share();
  std::string message;
  double waited = 0;
  RunRanks(2, o, &errors, [&](int r, NcclComm* comm) {
    Dev<float> d(1024);
    cudaMemset(d.p, 0, 1024 * sizeof(float));
    errors.Ok(r, Finish(comm->AllReduceSum(d.p, 1024, DType::kF32, "warm-up")), "warm-up");
    if (r == 1) {  // never joins the next all-reduce
      done.wait();
      return;
    }
    const auto t0 = Clock::now();
    auto w = comm->AllReduceSum(d.p, 1024, DType::kF32, "skipped by rank 1");
    Status st = w.ok() ? (*w)->Wait() : w.status();
    waited = std::chrono::duration<double>(Clock::now() - t0).count();
    message = st.ToString();
    errors.Check(0, !st.ok(), "the skipped all-reduce completed");
    errors.Check(0, !comm->Barrier("after failure").ok(), "a failed comm refuses new work");
    rank0_done.set_value();
  });
  for (const auto& s : errors.list) ADD_FAILURE() << s;
  EXPECT_NE(message.find("rank 0: all_reduce #2 (skipped by rank 1, 1024 x f32) timed out"),
            std::string::npos)
      << message;
  EXPECT_GE(waited, 2.0);
  EXPECT_LT(waited, 10.0);
}

}  // namespace
}  // namespace forge
