#include "metrics/timed_comm.h"

#include <chrono>
#include <cstdlib>

#include "metrics/worker_metrics.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

class TimedWork : public CommWork {
 public:
  TimedWork(CommWorkPtr inner, CollectiveOp op, WorkerMetrics* metrics)
      : inner_(std::move(inner)), op_(op), metrics_(metrics) {}
  Status Wait() override {
    const auto t0 = Clock::now();
    Status s = inner_->Wait();
    metrics_->AddCommSeconds(op_, std::chrono::duration<double>(Clock::now() - t0).count());
    return s;
  }
  bool Ready() override { return inner_->Ready(); }
  Status WaitOnStream(void* stream) override {
    const auto t0 = Clock::now();
    Status s = inner_->WaitOnStream(stream);
    metrics_->AddCommSeconds(op_, std::chrono::duration<double>(Clock::now() - t0).count());
    return s;
  }

 private:
  CommWorkPtr inner_;
  CollectiveOp op_;
  WorkerMetrics* metrics_;
};

class TimedComm : public Comm {
 public:
  TimedComm(std::unique_ptr<Comm> inner, WorkerMetrics* metrics)
      : inner_(std::move(inner)), metrics_(metrics) {}
  const char* name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }

  StatusOr<CommWorkPtr> AllReduceSum(void* buf, int64_t count, DType dtype,
                                     std::string_view what) override {
    return Wrap(inner_->AllReduceSum(buf, count, dtype, what), CollectiveOp::kAllReduce);
  }
  StatusOr<CommWorkPtr> ReduceScatterSum(const void* send, void* recv, int64_t recv_count,
                                         DType dtype, std::string_view what) override {
    return Wrap(inner_->ReduceScatterSum(send, recv, recv_count, dtype, what),
                CollectiveOp::kReduceScatter);
  }
  StatusOr<CommWorkPtr> AllGather(const void* send, void* recv, int64_t send_count, DType dtype,
                                  std::string_view what) override {
    return Wrap(inner_->AllGather(send, recv, send_count, dtype, what), CollectiveOp::kAllGather);
  }
  StatusOr<CommWorkPtr> Broadcast(void* buf, int64_t count, DType dtype, int root,
                                  std::string_view what) override {
    return Wrap(inner_->Broadcast(buf, count, dtype, root, what), CollectiveOp::kBroadcast);
  }
  StatusOr<CommWorkPtr> Barrier(std::string_view what) override {
    return Wrap(inner_->Barrier(what), CollectiveOp::kBarrier);
  }
  [[noreturn]] void Abort(const Status& why) override {
    inner_->Abort(why);
    std::abort();  // not reached: Abort ends the job
  }

 private:
  StatusOr<CommWorkPtr> Wrap(StatusOr<CommWorkPtr> work, CollectiveOp op) {
    if (!work.ok()) return work.status();
    return CommWorkPtr(std::make_unique<TimedWork>(std::move(work).value(), op, metrics_));
  }

  std::unique_ptr<Comm> inner_;
  WorkerMetrics* metrics_;
};

}  // namespace

std::unique_ptr<Comm> MakeTimedComm(std::unique_ptr<Comm> inner, WorkerMetrics* metrics) {
  if (!inner) return nullptr;
  return std::make_unique<TimedComm>(std::move(inner), metrics);
}

}  // namespace forge
