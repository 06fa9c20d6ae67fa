#include "metrics/timed_comm.h"

#include <chrono>
#include <cstdlib>

#include "metrics/worker_metrics.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

class TimedWork : public CommWork {
 public:
  TimedWork(CommWorkPtr inner, CollectiveOp op, CommTimeSink* sink)
      : inner_(std::move(inner)), op_(op), sink_(sink) {}
  Status Wait() override {
    const auto t0 = Clock::now();
    Status s = inner_->Wait();
    Count(t0);
    return s;
  }
  bool Ready() override { return inner_->Ready(); }
  Status WaitOnStream(void* stream) override {
    const auto t0 = Clock::now();
    Status s = inner_->WaitOnStream(stream);
    Count(t0);
    return s;
  }

 private:
  void Count(Clock::time_point t0) {
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    sink_->AddCollectiveSeconds(op_, s);
    sink_->AddExposedWaitSeconds(op_, s);
  }

  CommWorkPtr inner_;
  CollectiveOp op_;
  CommTimeSink* sink_;
};

class TimedComm : public Comm {
 public:
  TimedComm(std::unique_ptr<Comm> inner, WorkerMetrics* metrics, CommWaitClock* clock)
      : inner_(std::move(inner)), metrics_(metrics), clock_(clock), counter_(metrics, clock) {}
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
  // The part is timed into the same metrics and clock.
  StatusOr<std::unique_ptr<Comm>> Split(int color, int key, std::string_view what) override {
    FORGE_ASSIGN_OR_RETURN(std::unique_ptr<Comm> part, inner_->Split(color, key, what));
    return std::unique_ptr<Comm>(std::make_unique<TimedComm>(std::move(part), metrics_, clock_));
  }
  [[noreturn]] void Abort(const Status& why) override {
    inner_->Abort(why);
    std::abort();  // not reached: Abort ends the job
  }

 private:
  StatusOr<CommWorkPtr> Wrap(StatusOr<CommWorkPtr> work, CollectiveOp op) {
    if (!work.ok()) return work.status();
    return CommWorkPtr(std::make_unique<TimedWork>(std::move(work).value(), op, &counter_));
  }

  std::unique_ptr<Comm> inner_;
  WorkerMetrics* metrics_;
  CommWaitClock* clock_;
  CommTimeCounter counter_;
};

}  // namespace

void CommTimeCounter::AddCollectiveSeconds(CollectiveOp op, double seconds) {
  if (metrics_) metrics_->AddCollectiveSeconds(op, seconds);
}

void CommTimeCounter::AddExposedWaitSeconds(CollectiveOp op, double seconds) {
  if (metrics_) metrics_->AddCommSeconds(op, seconds);
  if (clock_) clock_->Add(seconds);
}

std::unique_ptr<Comm> MakeTimedComm(std::unique_ptr<Comm> inner, WorkerMetrics* metrics,
                                    CommWaitClock* clock) {
  if (!inner) return nullptr;
  return std::make_unique<TimedComm>(std::move(inner), metrics, clock);
}

}  // namespace forge
