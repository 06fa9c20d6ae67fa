#include "worker/parallel/mpi_comm.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "worker/parallel/sum_order.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

std::string MpiError(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, len);
}

MPI_Datatype MpiType(DType t) {
  switch (t) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kBF16: return MPI_UINT16_T;  // moved, never summed
  }
  return MPI_DATATYPE_NULL;
}

// One collective in flight. Stage 0: the first request (issued at once, on comm `first_`).
// When it completes, `reduce` runs (the local canonical sum) and `second` starts the second
// request (all-reduce's all-gather, on comm `second_`). Stage 2: done.
struct Op : CollectiveCall {
  int stage = 0;
  bool first_done = false;
  MPI_Request req = MPI_REQUEST_NULL;
  std::function<void()> reduce;
  std::function<int(MPI_Request*)> second;
  std::vector<char> scratch;
  std::vector<int> counts, displs, recv_counts, recv_displs;
};

class MpiComm;

class MpiWork final : public CommWork {
 public:
  MpiWork(MpiComm* comm, std::shared_ptr<Op> op) : comm_(comm), op_(std::move(op)) {}
  Status Wait() override;
  bool Ready() override;

 private:
  MpiComm* comm_;
  std::shared_ptr<Op> op_;
};

class MpiComm final : public Comm {
 public:
  // Takes `first` and `second` (two communicators of one group): MPI errors become return
  // codes; rank and world are `first`'s.
  MpiComm(const MpiCommOptions& o, MPI_Comm first, MPI_Comm second)
      : o_(o), first_(first), second_(second) {
    MPI_Comm_set_errhandler(first, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(second, MPI_ERRORS_RETURN);
    MPI_Comm_rank(first, &rank_);
    MPI_Comm_size(first, &world_);
    grace_s_ =
        o.abort_grace_s >= 0 ? o.abort_grace_s : std::min(30.0, std::max(1.0, o.timeout_s / 2));
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    thread_multiple_ = level == MPI_THREAD_MULTIPLE;
    watchdog_ = std::thread([this] { Watchdog(); });
  }

  ~MpiComm() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    // Finish what was started but never waited for (bounded by the timeout); after a failure
    // the requests may never complete, so the communicators are left alone.
    const auto deadline = Clock::now() + std::chrono::duration<double>(o_.timeout_s);
    bool clean = false;
    while (Clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!Progress().ok()) break;
        if (ops_.empty()) {
          clean = true;
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (clean) {
      MPI_Comm_free(&first_);
      MPI_Comm_free(&second_);
    }
  }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }

  StatusOr<CommWorkPtr> AllReduceSum(void* buf, int64_t n, DType t,
                                     std::string_view what) override {
    auto op = NewOp(CollectiveOp::kAllReduce, what, n, t);
    FORGE_RETURN_IF_ERROR(CheckSum(*op));
    if (!o_.canonical_sums) {
      return Start(op, [&](MPI_Request* req) {
        return MPI_Iallreduce(MPI_IN_PLACE, buf, int(n), MpiType(t), MPI_SUM, first_, req);
      });
    }
    // Chunk q of ceil(n/W) elements is summed on rank q: all-to-all, canonical sum, all-gather.
    const int W = world_;
    const int64_t c = (n + W - 1) / W;
    op->counts.resize(W);
    op->displs.resize(W);
    for (int q = 0; q < W; ++q) {
      op->counts[q] = int(std::clamp<int64_t>(n - q * c, 0, c));
      op->displs[q] = int(std::min<int64_t>(q * c, n));
    }
    const int mine = op->counts[rank_];
    const int esize = DTypeSize(t);
    op->scratch.resize(size_t(W) * mine * esize);
    op->recv_counts.assign(W, mine);
    op->recv_displs.resize(W);
    for (int q = 0; q < W; ++q) op->recv_displs[q] = q * mine;
    char* base = static_cast<char*>(buf);
    Op* o = op.get();
    op->reduce = [this, o, base, mine, esize] {
      SumParts(o, base + size_t(o->displs[rank_]) * esize, mine);
    };
    op->second = [this, o, base](MPI_Request* req) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, o->counts.data(),
                             o->displs.data(), MpiType(o->dtype), second_, req);
    };
    return Start(op, [&](MPI_Request* req) {
      return MPI_Ialltoallv(buf, op->counts.data(), op->displs.data(), MpiType(t),
                            op->scratch.data(), op->recv_counts.data(), op->recv_displs.data(),
                            MpiType(t), first_, req);
    });
  }

  StatusOr<CommWorkPtr> ReduceScatterSum(const void* send, void* recv, int64_t n, DType t,
                                         std::string_view what) override {
    auto op = NewOp(CollectiveOp::kReduceScatter, what, n, t);
    FORGE_RETURN_IF_ERROR(CheckSum(*op));
    FORGE_RETURN_IF_ERROR(CheckIntCount(*op, int64_t(world_) * n));
    const int esize = DTypeSize(t);
    const bool aliased = recv == static_cast<const char*>(send) + size_t(rank_) * n * esize;
    Op* o = op.get();
    if (!o_.canonical_sums) {
      if (!aliased)
        return Start(op, [&](MPI_Request* req) {
          return MPI_Ireduce_scatter_block(send, recv, int(n), MpiType(t), MPI_SUM, first_, req);
        });
      op->scratch.resize(size_t(n) * esize);  // MPI forbids overlapping send/recv
      op->reduce = [o, recv] { std::memcpy(recv, o->scratch.data(), o->scratch.size()); };
      return Start(op, [&](MPI_Request* req) {
        return MPI_Ireduce_scatter_block(send, op->scratch.data(), int(n), MpiType(t), MPI_SUM,
                                         first_, req);
      });
    }
    // Rank q receives every rank's block q (all-to-all), then sums them in canonical order.
    op->scratch.resize(size_t(world_) * n * esize);
    op->reduce = [this, o, recv, n] { SumParts(o, static_cast<char*>(recv), n); };
    return Start(op, [&](MPI_Request* req) {
      return MPI_Ialltoall(send, int(n), MpiType(t), op->scratch.data(), int(n), MpiType(t), first_,
                           req);
    });
  }

  StatusOr<CommWorkPtr> AllGather(const void* send, void* recv, int64_t n, DType t,
                                  std::string_view what) override {
    auto op = NewOp(CollectiveOp::kAllGather, what, n, t);
    FORGE_RETURN_IF_ERROR(CheckFailed(*op));
    FORGE_RETURN_IF_ERROR(CheckIntCount(*op, int64_t(world_) * n));
    const size_t bytes = size_t(n) * DTypeSize(t);
    const char* s = static_cast<const char*>(send);
    const char* r = static_cast<const char*>(recv);
    const bool in_place = s == r + rank_ * bytes;
    if (!in_place && s < r + world_ * bytes && r < s + bytes)
      return Fail(*op, Status::Invalid("send overlaps recv but is not this rank's slot"));
    return Start(op, [&](MPI_Request* req) {
      return MPI_Iallgather(in_place ? MPI_IN_PLACE : send, int(n), MpiType(t), recv, int(n),
                            MpiType(t), first_, req);
    });
  }

  StatusOr<CommWorkPtr> Broadcast(void* buf, int64_t n, DType t, int root,
                                  std::string_view what) override {
    auto op = NewOp(CollectiveOp::kBroadcast, what, n, t);
    FORGE_RETURN_IF_ERROR(CheckFailed(*op));
    if (root < 0 || root >= world_)
      return Fail(*op, Status::Invalid("bad root " + std::to_string(root)));
    FORGE_RETURN_IF_ERROR(CheckIntCount(*op, n));
    return Start(op, [&](MPI_Request* req) {
      return MPI_Ibcast(buf, int(n), MpiType(t), root, first_, req);
    });
  }

  StatusOr<CommWorkPtr> Barrier(std::string_view what) override {
    auto op = NewOp(CollectiveOp::kBarrier, what, 0, DType::kF32);
    FORGE_RETURN_IF_ERROR(CheckFailed(*op));
    return Start(op, [&](MPI_Request* req) { return MPI_Ibarrier(first_, req); });
  }

  // MPI_Comm_split of both underlying communicators (blocking, under mu_ like every MPI call
  // of this comm, once every collective in flight completed); the part gets its own watchdog
  // and the same options.
  StatusOr<std::unique_ptr<Comm>> Split(int color, int key, std::string_view what) override {
    auto op = NewOp(CollectiveOp::kBarrier, std::string("split ") + std::string(what), 0,
                    DType::kF32);
    FORGE_RETURN_IF_ERROR(CheckFailed(*op));
    if (color < 0) return Fail(*op, Status::Invalid("split color must be >= 0"));
    MPI_Comm first = MPI_COMM_NULL, second = MPI_COMM_NULL;
    int rc = MPI_SUCCESS;
    // Collectives in flight finish first: a second stage (on second_) that one rank started
    // before the split and another after it would pair the wrong collectives.
    for (auto nap = std::chrono::microseconds(20);;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        const Status st = Progress();
        if (!st.ok()) {
          failure_taken_ = true;
          return Fail(*op, st);
        }
        if (ops_.empty()) {
          rc = MPI_Comm_split(first_, color, key, &first);
          if (rc == MPI_SUCCESS) rc = MPI_Comm_split(second_, color, key, &second);
          break;
        }
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
    if (rc != MPI_SUCCESS) return Fail(*op, Status::Unavailable("MPI_Comm_split: " + MpiError(rc)));
    return std::unique_ptr<Comm>(new MpiComm(o_, first, second));
  }

  [[noreturn]] void Abort(const Status& why) override {
    std::fprintf(stderr, "forge: rank %d: aborting the job: %s\n", rank_, why.ToString().c_str());
    std::fflush(stderr);
    if (!thread_multiple_ && std::this_thread::get_id() != owner_) {
      std::_Exit(3);  // MPI may not be entered from this thread; mpirun ends the job for us
    }
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::_Exit(3);
  }

  // Waits for one op (called through MpiWork).
  Status WaitOp(const std::shared_ptr<Op>& op) {
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        Status st = Progress();
        if (op->stage == 2) return Status::Ok();
        if (!failed_.ok()) {
          failure_taken_ = true;
          return failed_;
        }
        if (!st.ok()) return st;
      }
      // Sleep rather than spin: ranks are often oversubscribed on CPU test machines.
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }

  bool OpReady(const std::shared_ptr<Op>& op) {
    std::lock_guard<std::mutex> l(mu_);
    (void)Progress();
    return op->stage == 2;
  }

 private:
  std::shared_ptr<Op> NewOp(CollectiveOp kind, std::string_view what, int64_t n, DType t) {
    auto op = std::make_shared<Op>();
    op->seq = next_seq_++;
    op->kind = kind;
    op->what = std::string(what);
    op->count = n;
    op->dtype = t;
    return op;
  }

  std::string Describe(const Op& op) const {
    return DescribeCollective(rank_, op.kind, op.seq, op.what, op.count, op.dtype);
  }

  Status Fail(const Op& op, const Status& st) const { return st.Annotate(Describe(op)); }

  Status CheckFailed(const Op& op) {
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) {
      failure_taken_ = true;
      return Status(
          failed_.code(),
          Describe(op) + " not started: the communicator already failed: " + failed_.message());
    }
    if (op.count < 0) return Fail(op, Status::Invalid("negative count"));
    return Status::Ok();
  }

  Status CheckSum(const Op& op) {
    FORGE_RETURN_IF_ERROR(CheckFailed(op));
    if (op.dtype == DType::kBF16) return Fail(op, Status::Invalid("MPI comm sums f32 or f64 only"));
    return CheckIntCount(op, op.count);
  }

  // MPI counts are ints: Invalid when `elements` does not fit one.
  Status CheckIntCount(const Op& op, int64_t elements) const {
    if (elements > INT_MAX) return Fail(op, Status::Invalid("more than INT_MAX elements"));
    return Status::Ok();
  }

  // Issues the first request under mu_: every MPI call of this comm is serialised by mu_, so
  // the watchdog may drive progress too.
  template <typename Issue>
  StatusOr<CommWorkPtr> Start(const std::shared_ptr<Op>& op, Issue&& issue) {
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) {
      failure_taken_ = true;
      return Status(
          failed_.code(),
          Describe(*op) + " not started: the communicator already failed: " + failed_.message());
    }
    const int rc = issue(&op->req);
    if (rc != MPI_SUCCESS) return Fail(*op, Status::Internal(MpiError(rc)));
    op->start = Clock::now();
    ops_.push_back(op);
    if (owner_ == std::thread::id()) owner_ = std::this_thread::get_id();
    return CommWorkPtr(new MpiWork(this, op));
  }

  // Canonical sum of the W parts in op->scratch (W x n elements) into out.
  void SumParts(Op* op, char* out, int64_t n) {
    const int W = world_;
    if (op->dtype == DType::kF64) {
      std::vector<double*> parts(W);
      for (int q = 0; q < W; ++q) parts[q] = reinterpret_cast<double*>(op->scratch.data()) + q * n;
      CanonicalSum(reinterpret_cast<double*>(out), parts.data(), W, n);
    } else {
      std::vector<float*> parts(W);
      for (int q = 0; q < W; ++q) parts[q] = reinterpret_cast<float*>(op->scratch.data()) + q * n;
      CanonicalSum(reinterpret_cast<float*>(out), parts.data(), W, n);
    }
  }

  // Advances every op in flight; mu_ held. Second stages start strictly in issue order, so
  // every rank starts them in the same order whatever the timing.
  Status Progress() {
    if (!failed_.ok()) return failed_;
    bool earlier_pending = false;  // an earlier op has yet to start its second stage
    for (auto& op : ops_) {
      int flag = 0;
      if (op->stage == 0) {
        if (!op->first_done) {
          const int rc = MPI_Test(&op->req, &flag, MPI_STATUS_IGNORE);
          if (rc != MPI_SUCCESS)
            return SetFailed(Status::Internal(Describe(*op) + ": " + MpiError(rc)));
          op->first_done = flag != 0;
        }
        if (op->first_done && !(op->second && earlier_pending)) {
          if (op->reduce) op->reduce();
          if (op->second) {
            const int rc = op->second(&op->req);
            if (rc != MPI_SUCCESS)
              return SetFailed(Status::Internal(Describe(*op) + ": " + MpiError(rc)));
            op->stage = 1;
          } else {
            op->stage = 2;
          }
        } else if (op->second) {
          earlier_pending = true;
        }
      }
      if (op->stage == 1) {
        const int rc = MPI_Test(&op->req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
          return SetFailed(Status::Internal(Describe(*op) + ": " + MpiError(rc)));
        if (flag) op->stage = 2;
      }
    }
    ops_.erase(
        std::remove_if(ops_.begin(), ops_.end(), [](const auto& op) { return op->stage == 2; }),
        ops_.end());
    return Status::Ok();
  }

  Status SetFailed(const Status& st) {  // mu_ held
    if (failed_.ok()) {
      failed_ = st;
      failed_at_ = Clock::now();
    }
    return failed_;
  }

  void Watchdog() {
    const auto tick = std::chrono::duration<double>(std::clamp(o_.timeout_s / 10, 0.005, 0.5));
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, tick);
      if (stop_) break;
      // With MPI_THREAD_MULTIPLE the watchdog also drives progress (mu_ serialises this
      // comm's MPI calls): collectives then advance while the owner computes, and one that
      // completed is never mistaken for a hang because nobody polled it.
      if (thread_multiple_) (void)Progress();
      const auto now = Clock::now();
      if (failed_.ok() && !ops_.empty()) {
        const Op& oldest = *ops_.front();  // ops_ is in issue order
        const double age = std::chrono::duration<double>(now - oldest.start).count();
        if (age > o_.timeout_s) {
          char secs[32];
          std::snprintf(secs, sizeof secs, "%g", o_.timeout_s);
          (void)SetFailed(Status::Unavailable(
              Describe(oldest) + " timed out: not complete after " + secs +
              " s (parallel.collective_timeout_s); another rank is stuck, gone, or skipped it"));
        }
      }
      if (!failed_.ok() && !failure_taken_ &&
          std::chrono::duration<double>(now - failed_at_).count() > grace_s_) {
        const Status why = failed_;
        l.unlock();
        Abort(why.Annotate("nobody waited for the failed collective"));
      }
    }
  }

  const MpiCommOptions o_;
  MPI_Comm first_, second_;
  int rank_ = 0, world_ = 1;  // set once, by the constructor
  double grace_s_ = 1.0;
  bool thread_multiple_ = false;
  uint64_t next_seq_ = 1;

  std::mutex mu_;                        // guards everything below (the watchdog reads it)
  std::deque<std::shared_ptr<Op>> ops_;  // started, not complete, in issue order
  Status failed_;
  Clock::time_point failed_at_;
  bool failure_taken_ = false;  // a caller received failed_
  std::thread::id owner_;
  bool stop_ = false;
  std::condition_variable cv_;
  std::thread watchdog_;
};

Status MpiWork::Wait() { return comm_->WaitOp(op_); }
bool MpiWork::Ready() { return comm_->OpReady(op_); }

}  // namespace

Status InitMpi() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return Status::Ok();
  int provided = 0;
  const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) return Status::Unavailable("MPI_Init_thread failed: " + MpiError(rc));
  return Status::Ok();
}

void FinalizeMpi() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

bool MpiInitialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

StatusOr<std::unique_ptr<Comm>> MakeMpiComm(const MpiCommOptions& options) {
  if (!MpiInitialized()) return Status::Precondition("MakeMpiComm: MPI is not initialised");
  if (!(options.timeout_s > 0)) return Status::Invalid("parallel.collective_timeout_s must be > 0");
  MPI_Comm first = MPI_COMM_NULL, second = MPI_COMM_NULL;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &first);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &second);
  if (rc != MPI_SUCCESS) return Status::Unavailable("MPI_Comm_dup failed: " + MpiError(rc));
  return std::unique_ptr<Comm>(new MpiComm(options, first, second));
}

}  // namespace forge
