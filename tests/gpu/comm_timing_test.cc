// Collective times on the GPU (comm_time_sink.h): NcclComm's per-collective device time
// (CUDA events around each collective on its stream), StreamWaitTimer's stall of a stream
// waiting for another, and both through the CUDA backend's data-parallel step. Each measured
// time is checked against an independent measurement of the same work: events the test records
// around it, and the host's wall clock. NCCL with one rank runs its collectives as real copies on
// its stream, so the NcclComm checks need one GPU; the training check needs 2 (skips below).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "nccl_test_util.h"
#include "tiny_gpu_config.h"
#include "worker/parallel/comm_time_sink.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/parallel/stream_wait_timer.h"
#include "worker/train/cuda_backend.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// What a sink was told, by op.
class RecordingSink final : public CommTimeSink {
 public:
  void AddCollectiveSeconds(CollectiveOp op, double s) override {
    std::lock_guard<std::mutex> l(mu_);
    collective_[op] += s;
    ++collective_calls_;
  }
  void AddExposedWaitSeconds(CollectiveOp op, double s) override {
    std::lock_guard<std::mutex> l(mu_);
    exposed_[op] += s;
    ++exposed_calls_;
  }
  double collective(CollectiveOp op) {
    std::lock_guard<std::mutex> l(mu_);
    return collective_[op];
  }
  double exposed(CollectiveOp op) {
    std::lock_guard<std::mutex> l(mu_);
    return exposed_[op];
  }
  double exposed_total() {
    std::lock_guard<std::mutex> l(mu_);
    double t = 0;
    for (const auto& [op, s] : exposed_) t += s;
    return t;
  }
  int collective_calls() {
    std::lock_guard<std::mutex> l(mu_);
    return collective_calls_;
  }
  int exposed_calls() {
    std::lock_guard<std::mutex> l(mu_);
    return exposed_calls_;
  }

 private:
  std::mutex mu_;
  std::map<CollectiveOp, double> collective_, exposed_;
  int collective_calls_ = 0, exposed_calls_ = 0;
};

// A host callback that holds `stream` for `ms` milliseconds: device-side delay without a kernel.
void CUDART_CB SleepMs(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms)));
}

float EventMs(cudaEvent_t a, cudaEvent_t b) {
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  return ms;
}

TEST(NcclCommTiming, WorldOneCollectivesAreTimedWithinTheirOwnSpan) {
  FORGE_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  NcclCommOptions o;
  o.device = 0;
  o.timeout_s = 60;
  auto made = MakeNcclComm(0, 1, nullptr, o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  NcclComm* comm = made->get();
  RecordingSink sink;
  comm->SetTimeSink(&sink);
  EXPECT_EQ(comm->time_sink(), &sink);
  auto s = static_cast<cudaStream_t>(comm->stream());

  // 4 out-of-place all-gathers of 256 Mi floats (world 1: 1 GiB device copies), bracketed by
  // the test's own events on the comm stream and by the host clock.
  const int64_t n = int64_t{256} << 20;
  float *send = nullptr, *recv = nullptr;
  ASSERT_EQ(cudaMalloc(&send, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(send, 1, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaEvent_t begin, end;
  ASSERT_EQ(cudaEventCreate(&begin), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  const auto t0 = Clock::now();
  ASSERT_EQ(cudaEventRecord(begin, s), cudaSuccess);
  std::vector<CommWorkPtr> works;
  for (int i = 0; i < 4; ++i) {
    auto w = comm->AllGather(send, recv, n, DType::kF32, "timed");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    works.push_back(std::move(*w));
  }
  EXPECT_EQ(comm->last_op(), CollectiveOp::kAllGather);
  ASSERT_EQ(cudaEventRecord(end, s), cudaSuccess);
  ASSERT_TRUE(works.back()->Wait().ok());
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  const double wall = Since(t0);
  comm->CountFinished();  // the first three finished unseen by Wait
  const double span = EventMs(begin, end) * 1e-3;
  const double timed = sink.collective(CollectiveOp::kAllGather);
  EXPECT_EQ(sink.collective_calls(), 4);
  EXPECT_GT(timed, 0.0);
  EXPECT_LE(timed, span + 1e-5) << "the collectives fill [begin, end] and nothing else";
  EXPECT_GE(timed, 0.25 * span) << "the collectives are most of [begin, end]";
  EXPECT_LE(timed, wall);
  EXPECT_EQ(sink.exposed_calls(), 0);  // the comm alone reports no stall: nothing waited
  for (auto& w : works) EXPECT_TRUE(w->Wait().ok());
  // The watchdog retires them again later: still counted once each.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(sink.collective_calls(), 4);

  // Behind a producer stream held for 200 ms: the collective's time starts when the comm stream
  // reaches it, so the queueing is not counted, while the host waits for all of it.
  cudaStream_t producer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), cudaSuccess);
  static int hold_ms = 200;
  ASSERT_EQ(cudaLaunchHostFunc(producer, SleepMs, &hold_ms), cudaSuccess);
  comm->SetProducerStream(producer);
  const double before = sink.collective(CollectiveOp::kAllGather);
  const auto t1 = Clock::now();
  auto w = comm->AllGather(send, recv, n, DType::kF32, "behind a producer");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Wait().ok());
  const double held_wall = Since(t1);
  const double one = sink.collective(CollectiveOp::kAllGather) - before;
  EXPECT_GE(held_wall, 0.19);
  EXPECT_GT(one, 0.0);
  EXPECT_LT(one, 0.1) << "the 200 ms behind the producer were counted as collective time";
  comm->SetProducerStream(nullptr);

  // Without a sink nothing is timed; SetTimeSink(nullptr) returns with no call in flight.
  comm->SetTimeSink(nullptr);
  const int calls = sink.collective_calls();
  auto w2 = comm->AllGather(send, recv, n, DType::kF32, "untimed");
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE((*w2)->Wait().ok());
  comm->CountFinished();
  EXPECT_EQ(sink.collective_calls(), calls);

  cudaStreamDestroy(producer);
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  cudaFree(send);
  cudaFree(recv);
}

TEST(StreamWaitTimer, MeasuresTheStallOfAWaitingStream) {
  FORGE_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t busy, waiting;
  ASSERT_EQ(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t done;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  RecordingSink sink;
  StreamWaitTimer timer;

  // `waiting` stands still for the 150 ms `busy` is held.
  static int hold_ms = 150;
  const auto t0 = Clock::now();
  ASSERT_EQ(cudaLaunchHostFunc(busy, SleepMs, &hold_ms), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, busy), cudaSuccess);
  ASSERT_TRUE(timer.Wait(waiting, done, CollectiveOp::kAllReduce, true).ok());
  EXPECT_EQ(timer.pending(), 1u);
  ASSERT_EQ(cudaStreamSynchronize(waiting), cudaSuccess);
  const double wall = Since(t0);
  timer.Collect(&sink);
  EXPECT_EQ(timer.pending(), 0u);
  const double stall = sink.exposed(CollectiveOp::kAllReduce);
  EXPECT_GE(stall, 0.12);
  EXPECT_LE(stall, wall);

  // A wait for work already done costs (next to) nothing; an untimed wait records nothing.
  ASSERT_TRUE(timer.Wait(waiting, done, CollectiveOp::kAllGather, true).ok());
  ASSERT_TRUE(timer.Wait(waiting, done, CollectiveOp::kBroadcast, false).ok());
  EXPECT_EQ(timer.pending(), 1u);
  ASSERT_EQ(cudaStreamSynchronize(waiting), cudaSuccess);
  timer.Collect(&sink);
  EXPECT_LT(sink.exposed(CollectiveOp::kAllGather), 0.005);
  EXPECT_EQ(sink.exposed_calls(), 2);

  // Collect never blocks: a stall still in progress stays pending.
  ASSERT_EQ(cudaLaunchHostFunc(busy, SleepMs, &hold_ms), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, busy), cudaSuccess);
  ASSERT_TRUE(timer.Wait(waiting, done, CollectiveOp::kAllReduce, true).ok());
  const auto t1 = Clock::now();
  timer.Collect(&sink);
  EXPECT_LT(Since(t1), 0.05);
  EXPECT_EQ(timer.pending(), 1u);
  ASSERT_EQ(cudaStreamSynchronize(waiting), cudaSuccess);
  timer.Collect(nullptr);  // dropped without a sink
  EXPECT_EQ(timer.pending(), 0u);
  EXPECT_EQ(sink.exposed_calls(), 2);

  cudaEventDestroy(done);
  cudaStreamDestroy(busy);
  cudaStreamDestroy(waiting);
}

// Two ranks training ddp, rank 1 held back on the host before each step: rank 0's compute
// stream stalls at the gradient all-reduces (its exposed wait grows by about the hold per
// step), rank 1's does not; both ranks' collective times are positive and within the steps'
// wall time. This is the signal the straggler watch reads (busy = step - exposed wait).
TEST(CudaBackendCommTiming, ExposedWaitFallsOnTheRankThatWaits) {
  FORGE_SKIP_WITHOUT_GPU();
  if (NcclVisibleDevices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  RunConfig c = test::TinyGpuConfig("gpu-comm-timing-test");
  c.batch.global_batch = 2 * c.batch.micro_batch;
  const int64_t N = int64_t{c.batch.micro_batch} * c.model.seq_len;
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, c.model.vocab - 1);
  std::vector<std::vector<int32_t>> tokens(4);
  for (auto& t : tokens) {
    t.resize(N);
    for (auto& x : t) x = tok(rng);
  }
  constexpr int kSteps = 5, kHoldMs = 100;
  RecordingSink sinks[2];
  double wall[2] = {0, 0}, exposed[2] = {0, 0};  // over the held steps
  Errors e;
  NcclCommOptions o;
  o.timeout_s = 120;
  RunRanks(2, o, &e, [&](int r, NcclComm* comm) {
    comm->SetTimeSink(&sinks[r]);
    auto made = MakeCudaTrainBackend(c, CudaBackendOptions{}, comm);
    if (!made.ok()) return e.Add(r, "backend: " + made.status().ToString());
    std::vector<MicroBatch> micro = {{tokens[2 * r].data(), tokens[2 * r + 1].data()}};
    StepStats st;
    e.Ok(r, (*made)->TrainStep(micro, StepHyper(1e-3f, 1), true, &st), "warm-up step");
    const double warm_exposed = sinks[r].exposed_total();  // counted after the step's sync
    const auto t0 = Clock::now();
    for (int s = 2; s <= kSteps; ++s) {
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(kHoldMs));
      e.Ok(r, (*made)->TrainStep(micro, StepHyper(1e-3f, s), true, &st), "step");
    }
    wall[r] = Since(t0);
    exposed[r] = sinks[r].exposed_total() - warm_exposed;
    made->reset();
    comm->SetTimeSink(nullptr);
  });
  for (const std::string& m : e.list) ADD_FAILURE() << m;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_GT(sinks[r].collective(CollectiveOp::kAllReduce), 0.0);
    EXPECT_GT(sinks[r].exposed_calls(), 0);
    EXPECT_LE(exposed[r], wall[r]);
  }
  // 4 held steps of 100 ms: rank 0 stands still for most of them, rank 1 hardly.
  EXPECT_GE(exposed[0], 0.25);
  EXPECT_LT(exposed[1], 0.5 * exposed[0]);
}

}  // namespace
}  // namespace forge
