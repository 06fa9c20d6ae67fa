#include "worker/parallel/nccl_comm.h"

#ifdef FORGE_HAVE_CUDA

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "worker/parallel/copy_engine_allreduce.h"

namespace forge {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kBF16: return ncclBfloat16;
  }
  return ncclFloat32;
}

std::string CudaError(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// The calling thread's current device for the lifetime of the guard.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

struct Op : CollectiveCall {
  cudaEvent_t done = nullptr;
  cudaEvent_t began = nullptr;  // timed collectives only (SetTimeSink): the start on the stream
  bool finished = false;
};

class NcclCommImpl;

ncclResult_t WaitForInit(ncclComm_t comm, ncclResult_t r, double timeout_s);  // below

class NcclWork final : public CommWork {
 public:
  NcclWork(NcclCommImpl* comm, std::shared_ptr<Op> op) : comm_(comm), op_(std::move(op)) {}
  Status Wait() override;
  bool Ready() override;
  Status WaitOnStream(void* stream) override;

 private:
  NcclCommImpl* comm_;
  std::shared_ptr<Op> op_;
};

class NcclCommImpl final : public NcclComm {
 public:
  NcclCommImpl(int rank, int world, int device, const NcclCommOptions& o)
      : rank_(rank), world_(world), device_(device), o_(o) {
    grace_s_ =
        o.abort_grace_s >= 0 ? o.abort_grace_s : std::min(30.0, std::max(1.0, o.timeout_s / 2));
  }

  // Second half of construction: the communicator exists (init finished).
  Status Start(ncclComm_t comm) {
    comm_ = comm;
    DeviceGuard g(device_);
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    cudaError_t e = cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&producer_ready_, cudaEventDisableTiming);
    if (e != cudaSuccess) return Status::Internal("NCCL comm stream: " + CudaError(e));
    watchdog_ = std::thread([this] { Watchdog(); });
    return Status::Ok();
  }

  ~NcclCommImpl() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    DeviceGuard g(device_);
    if (comm_ != nullptr) {
      std::lock_guard<std::mutex> l(mu_);
      if (failed_.ok()) {
        for (const SymmetricMemory& m : memory_) {
          if (m.win == nullptr) continue;
          ncclResult_t r = ncclCommWindowDeregister(comm_, m.win);  // local: no peer waits
          if (r == ncclSuccess || r == ncclInProgress)
            WaitNotInProgress(Clock::now() + Seconds(o_.timeout_s));
        }
        // Finalize flushes outstanding work; bounded, then abort as the fallback.
        ncclResult_t r = ncclCommFinalize(comm_);
        if (r == ncclSuccess || r == ncclInProgress)
          r = WaitNotInProgress(Clock::now() + Seconds(o_.timeout_s));
        if (r == ncclSuccess)
          ncclCommDestroy(comm_);
        else
          ncclCommAbort(comm_);
      } else if (!aborted_) {
        ncclCommAbort(comm_);
      }
    }
    for (const SymmetricMemory& m : memory_) ncclMemFree(m.ptr);
    copy_engine_.reset();  // waits for its lanes (released above if the comm failed)
    for (auto& op : pending_) DestroyEvents(*op);
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (producer_ready_) cudaEventDestroy(producer_ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int device() const override { return device_; }
  const char* comm_name() const { return o_.name.c_str(); }  // outlives the communicator
  void* stream() const override { return stream_; }
  void SetProducerStream(void* s) override { producer_ = static_cast<cudaStream_t>(s); }

  void SetTimeSink(CommTimeSink* sink) override {
    std::lock_guard<std::mutex> l(mu_);
    sink_.store(sink);
  }
  CommTimeSink* time_sink() const override { return sink_.load(); }
  CollectiveOp last_op() const override { return last_op_.load(); }
  void CountFinished() override {
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) return;
    DeviceGuard g(device_);
    for (auto& op : pending_) {
      if (op->finished) continue;
      if (cudaEventQuery(op->done) != cudaSuccess) break;  // they complete in stream order
      MarkFinished(*op);
    }
  }

  StatusOr<CommWorkPtr> AllReduceSum(void* buf, int64_t n, DType t,
                                     std::string_view what) override {
    if (copy_engine_ != nullptr && t == DType::kF32 && copy_engine_->Covers(buf, n)) {
      return Issue(CollectiveOp::kAllReduce, what, n, t, [&] {
        return copy_engine_->Enqueue(static_cast<float*>(buf), n, stream_);
      });
    }
    return Issue(CollectiveOp::kAllReduce, what, n, t, [&] {
      return Nccl(ncclAllReduce(buf, buf, size_t(n), NcclType(t), ncclSum, comm_, stream_));
    });
  }
  StatusOr<CommWorkPtr> ReduceScatterSum(const void* send, void* recv, int64_t n, DType t,
                                         std::string_view what) override {
    return Issue(CollectiveOp::kReduceScatter, what, n, t, [&] {
      return Nccl(
          ncclReduceScatter(send, recv, size_t(n), NcclType(t), ncclSum, comm_, stream_));
    });
  }
  StatusOr<CommWorkPtr> AllGather(const void* send, void* recv, int64_t n, DType t,
                                  std::string_view what) override {
    return Issue(CollectiveOp::kAllGather, what, n, t, [&] {
      return Nccl(ncclAllGather(send, recv, size_t(n), NcclType(t), comm_, stream_));
    });
  }
  StatusOr<CommWorkPtr> Broadcast(void* buf, int64_t n, DType t, int root,
                                  std::string_view what) override {
    if (root < 0 || root >= world_)
      return Status::Invalid(DescribeCollective(rank_, CollectiveOp::kBroadcast, 0, what, n, t) +
                             ": bad root " + std::to_string(root));
    return Issue(CollectiveOp::kBroadcast, what, n, t, [&] {
      return Nccl(ncclBroadcast(buf, buf, size_t(n), NcclType(t), root, comm_, stream_));
    });
  }

  Status EnableCopyEngineAllReduce(float* base, int64_t count, int64_t max_count) override {
    copy_engine_.reset();
    DeviceGuard g(device_);
    // Setup's exchanges ride AllGather through a device scratch, as 4-byte words (the blobs
    // are whole words; a gather moves bits).
    auto exchange = [this](const void* mine, void* all, size_t bytes) -> Status {
      if (bytes % sizeof(float) != 0) {
        return Status::Invalid("copy-engine all-reduce setup: " + std::to_string(bytes) +
                               " bytes is not a whole number of 4-byte words");
      }
      const size_t n = bytes * size_t(world_);
      void* d = nullptr;
      if (cudaMalloc(&d, n) != cudaSuccess) {
        (void)cudaGetLastError();
        return Status::Unavailable("copy-engine all-reduce setup: cudaMalloc");
      }
      Status st = Status::Ok();
      if (cudaMemcpy(static_cast<char*>(d) + bytes * size_t(rank_), mine, bytes,
                     cudaMemcpyHostToDevice) != cudaSuccess) {
        st = Status::Internal("copy-engine all-reduce setup: cudaMemcpy");
      }
      if (st.ok()) {
        auto work = AllGather(static_cast<char*>(d) + bytes * size_t(rank_), d,
                              int64_t(bytes / sizeof(float)), DType::kF32, "copy-engine setup");
        st = work.ok() ? (*work)->Wait() : work.status();
      }
      if (st.ok() && cudaMemcpy(all, d, n, cudaMemcpyDeviceToHost) != cudaSuccess) {
        st = Status::Internal("copy-engine all-reduce setup: cudaMemcpy");
      }
      cudaFree(d);
      return st;
    };
    auto copy_engine =
        CopyEngineAllReduce::Create(rank_, world_, device_, base, count, max_count, exchange);
    if (!copy_engine.ok()) return copy_engine.status().Annotate("rank " + std::to_string(rank_));
    copy_engine_ = std::move(*copy_engine);
    return Status::Ok();
  }
  bool SupportsSymmetricMemory() const override { return true; }
  StatusOr<void*> AllocSymmetric(size_t bytes) override {
    const std::string who = "rank " + std::to_string(rank_) + ": symmetric memory of " +
                            std::to_string(bytes) + " bytes";
    const size_t n = std::max<size_t>(bytes, 256);
    DeviceGuard g(device_);
    void* p = nullptr;
    ncclResult_t r = ncclMemAlloc(&p, n);
    if (r != ncclSuccess || p == nullptr)
      return Status::Unavailable(who + ": ncclMemAlloc: " + ncclGetErrorString(r) +
                                 " (engine.nccl_symmetric_memory: false uses cudaMalloc)");
    cudaError_t e = cudaMemset(p, 0, n);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      ncclMemFree(p);
      return Status::Internal(who + ": " + CudaError(e));
    }
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) {
      ncclMemFree(p);
      return Status(failed_.code(), who + ": the communicator already failed");
    }
    ncclWindow_t win = nullptr;
    r = ncclCommWindowRegister(comm_, p, n, &win, NCCL_WIN_COLL_SYMMETRIC);
    // Non-blocking, the registration is a group job: the call may return ncclSuccess with the
    // job still running (`win` unset, and the comm's next call refused) until the comm's async
    // state leaves ncclInProgress.
    if (r == ncclSuccess || r == ncclInProgress)
      r = WaitNotInProgress(Clock::now() + Seconds(o_.timeout_s));
    if (r != ncclSuccess) {
      ncclMemFree(p);
      return Status::Unavailable(who + ": ncclCommWindowRegister: " + NcclError(r));
    }
    // A null window after success: NCCL has no symmetric kernels for these ranks (not all
    // peers reach each other over CUDA P2P, e.g. across nodes): plain memory, collectives as
    // without it.
    memory_.push_back({p, win});
    return p;
  }

  StatusOr<std::unique_ptr<NcclComm>> SplitNccl(int color, int key,
                                                std::string_view what) override {
    const std::string who = "rank " + std::to_string(rank_) + ": split (" + std::string(what) + ")";
    if (color < 0) return Status::Invalid(who + ": color must be >= 0");
    DeviceGuard g(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // polled below, so a rank that never joins is a timeout
    if (o_.max_ctas > 0) config.maxCTAs = o_.max_ctas;
    if (o_.cta_policy >= 0) config.CTAPolicy = o_.cta_policy;
    ncclComm_t part = nullptr;
    ncclResult_t r;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!failed_.ok())
        return Status(failed_.code(), who + ": the communicator already failed: " +
                                          failed_.message());
      r = ncclCommSplit(comm_, color, key, &part, &config);
      // Non-blocking, the split completes with the parent (its async state leaves
      // ncclInProgress) and only then is `part` filled: a call that returns ncclSuccess may
      // leave it null until then (seen with NCCL 2.28 on two H200s).
      if (r == ncclInProgress || (r == ncclSuccess && part == nullptr))
        r = WaitNotInProgress(Clock::now() + Seconds(o_.timeout_s));
    }
    if (r == ncclSuccess && part != nullptr) r = WaitForInit(part, ncclInProgress, o_.timeout_s);
    if (r != ncclSuccess || part == nullptr) {
      const std::string detail = r == ncclInProgress
                                     ? std::string("timed out (other ranks missing?)")
                                     : std::string(ncclGetErrorString(r));
      if (part != nullptr) ncclCommAbort(part);
      return Status::Unavailable(who + ": ncclCommSplit: " + detail);
    }
    int n = 0, me = 0;
    if (ncclCommCount(part, &n) != ncclSuccess || ncclCommUserRank(part, &me) != ncclSuccess) {
      ncclCommAbort(part);
      return Status::Internal(who + ": cannot read the part's size and rank");
    }
    auto impl = std::make_unique<NcclCommImpl>(me, n, device_, o_);
    FORGE_RETURN_IF_ERROR(impl->Start(part).Annotate(who));
    impl->SetTimeSink(sink_.load());  // the part reports where this one does, from now on
    return std::unique_ptr<NcclComm>(std::move(impl));
  }

  StatusOr<CommWorkPtr> Barrier(std::string_view what) override {
    // NCCL has no barrier: an all-reduce of one float on a private device scratch.
    if (barrier_buf_ == nullptr) {
      DeviceGuard g(device_);
      cudaError_t e = cudaMalloc(&barrier_buf_, sizeof(float));
      if (e != cudaSuccess) return Status::Internal("NCCL barrier scratch: " + CudaError(e));
    }
    return Issue(CollectiveOp::kBarrier, what, 0, DType::kF32, [&] {
      return Nccl(
          ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
    });
  }

  [[noreturn]] void Abort(const Status& why) override {
    std::fprintf(stderr, "forge: rank %d: aborting the job: %s\n", rank_, why.ToString().c_str());
    std::fflush(stderr);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (comm_ != nullptr && !aborted_) {
        ncclCommAbort(comm_);
        aborted_ = true;
      }
    }
    int mpi = 0, fin = 0;
    MPI_Initialized(&mpi);
    MPI_Finalized(&fin);
    if (mpi && !fin) MPI_Abort(MPI_COMM_WORLD, 3);
    std::_Exit(3);
  }

  Status WaitOp(const std::shared_ptr<Op>& op) {
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!failed_.ok()) {
          failure_taken_ = true;
          return failed_;
        }
        if (op->finished) return Status::Ok();
        DeviceGuard g(device_);
        const cudaError_t e = cudaEventQuery(op->done);
        if (e == cudaSuccess) {
          MarkFinished(*op);
          return Status::Ok();
        }
        if (e != cudaErrorNotReady) {
          failure_taken_ = true;
          return Fail(*op, Status::Internal(CudaError(e)));
        }
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(500));
    }
  }

  bool OpReady(const std::shared_ptr<Op>& op) {
    std::lock_guard<std::mutex> l(mu_);
    if (op->finished) return true;
    DeviceGuard g(device_);
    if (cudaEventQuery(op->done) == cudaSuccess) MarkFinished(*op);
    return op->finished;
  }

  Status OpOnStream(const std::shared_ptr<Op>& op, void* s) {
    std::lock_guard<std::mutex> l(mu_);
    if (!failed_.ok()) {
      failure_taken_ = true;
      return failed_;
    }
    if (op->finished) return Status::Ok();  // nothing left to wait for (event may be retired)
    DeviceGuard g(device_);
    const cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(s), op->done, 0);
    if (e != cudaSuccess) return Status::Internal(Describe(*op) + ": " + CudaError(e));
    return Status::Ok();
  }

  // An NCCL call's result (mu_ held): in-progress polled to the end; a bad argument is
  // Invalid (the caller's mistake, the communicator is fine), anything else Internal.
  Status Nccl(ncclResult_t r) {
    if (r == ncclInProgress) r = WaitNotInProgress(Clock::now() + Seconds(o_.timeout_s));
    if (r == ncclSuccess) return Status::Ok();
    const std::string msg = "NCCL: " + NcclError(r);
    return r == ncclInvalidArgument || r == ncclInvalidUsage ? Status::Invalid(msg)
                                                             : Status::Internal(msg);
  }

  // Polls a non-blocking communicator until its last call left ncclInProgress.
  ncclResult_t WaitNotInProgress(Clock::time_point deadline) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return ncclInternalError;
      if (state != ncclInProgress) break;
      if (Clock::now() > deadline) return ncclInProgress;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return state;
  }

 private:
  static std::chrono::nanoseconds Seconds(double s) {
    return std::chrono::nanoseconds(int64_t(s * 1e9));
  }

  std::string Describe(const Op& op) const {
    return DescribeCollective(rank_, op.kind, op.seq, op.what, op.count, op.dtype);
  }
  Status Fail(const Op& op, const Status& st) const { return st.Annotate(Describe(op)); }

  std::string NcclError(ncclResult_t r) const {
    std::string s = ncclGetErrorString(r);
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    if (last != nullptr && *last != '\0') s += std::string(" (") + last + ")";
    return s;
  }

  template <typename Call>
  StatusOr<CommWorkPtr> Issue(CollectiveOp kind, std::string_view what, int64_t n, DType t,
                              Call&& call) {
    auto op = std::make_shared<Op>();
    op->kind = kind;
    op->what = std::string(what);
    op->count = n;
    op->dtype = t;
    std::lock_guard<std::mutex> l(mu_);
    op->seq = next_seq_++;
    if (!failed_.ok()) {
      failure_taken_ = true;
      return Status(
          failed_.code(),
          Describe(*op) + " not started: the communicator already failed: " + failed_.message());
    }
    if (n < 0) return Fail(*op, Status::Invalid("negative count"));
    DeviceGuard g(device_);
    // Timed: both events keep timing; otherwise `done` is the cheaper untimed kind.
    const bool timed = sink_.load() != nullptr;
    cudaError_t e = cudaEventCreateWithFlags(&op->done, timed ? cudaEventDefault
                                                              : cudaEventDisableTiming);
    if (e == cudaSuccess && timed) e = cudaEventCreateWithFlags(&op->began, cudaEventDefault);
    if (e == cudaSuccess && producer_ != nullptr) {
      e = cudaEventRecord(producer_ready_, producer_);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, producer_ready_, 0);
    }
    if (e == cudaSuccess && timed) e = cudaEventRecord(op->began, stream_);
    if (e != cudaSuccess) {
      DestroyEvents(*op);
      return Fail(*op, Status::Internal(CudaError(e)));
    }
    Status called = call();
    if (!called.ok()) {
      DestroyEvents(*op);
      const Status st = Fail(*op, called);
      if (called.code() != Code::kInvalidArgument) SetFailed(st);
      return st;
    }
    e = cudaEventRecord(op->done, stream_);
    if (e != cudaSuccess) {
      DestroyEvents(*op);
      return Fail(*op, Status::Internal(CudaError(e)));
    }
    last_op_.store(kind);
    op->start = Clock::now();
    pending_.push_back(op);
    return CommWorkPtr(new NcclWork(this, op));
  }

  static void DestroyEvents(Op& op) {
    if (op.done) cudaEventDestroy(op.done);
    if (op.began) cudaEventDestroy(op.began);
    op.done = op.began = nullptr;
  }

  // The op's `done` event completed (mu_ held): a timed op reports its device time, once.
  void MarkFinished(Op& op) {
    if (op.finished) return;
    op.finished = true;
    if (op.began == nullptr) return;
    float ms = 0.0f;
    CommTimeSink* sink = sink_.load();
    if (sink != nullptr && cudaEventElapsedTime(&ms, op.began, op.done) == cudaSuccess)
      sink->AddCollectiveSeconds(op.kind, double(ms) * 1e-3);
    cudaEventDestroy(op.began);
    op.began = nullptr;
  }

  void SetFailed(const Status& st) {  // mu_ held
    if (!failed_.ok()) return;
    failed_ = st;
    failed_at_ = Clock::now();
    if (copy_engine_ != nullptr) copy_engine_->Release();  // its streams wait on flags, not on NCCL
    if (comm_ != nullptr && !aborted_) {
      ncclCommAbort(comm_);  // frees kernels stuck waiting for a peer
      aborted_ = true;
    }
  }

  void Watchdog() {
    cudaSetDevice(device_);
    const auto tick = std::chrono::duration<double>(std::clamp(o_.timeout_s / 10, 0.005, 0.5));
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, tick);
      if (stop_) break;
      if (failed_.ok()) {
        // Retire finished collectives from the front (they complete in stream order).
        while (!pending_.empty()) {
          auto& op = pending_.front();
          if (!op->finished && cudaEventQuery(op->done) == cudaSuccess) MarkFinished(*op);
          if (!op->finished) break;
          DestroyEvents(*op);
          pending_.pop_front();
        }
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          const std::string during = pending_.empty() ? std::string("rank ") + std::to_string(rank_)
                                                      : Describe(*pending_.front());
          SetFailed(Status::Internal(during + ": NCCL async error: " + NcclError(async)));
        } else if (!pending_.empty()) {
          const Op& oldest = *pending_.front();
          const double age = std::chrono::duration<double>(Clock::now() - oldest.start).count();
          if (age > o_.timeout_s) {
            char secs[32];
            std::snprintf(secs, sizeof secs, "%g", o_.timeout_s);
            SetFailed(Status::Unavailable(
                Describe(oldest) + " timed out: not complete after " + secs +
                " s (parallel.collective_timeout_s); another rank is stuck, gone, or skipped it; "
                "communicator aborted"));
          }
        }
      }
      if (!failed_.ok() && !failure_taken_ &&
          std::chrono::duration<double>(Clock::now() - failed_at_).count() > grace_s_) {
        const Status why = failed_;
        l.unlock();
        Abort(why.Annotate("nobody waited for the failed collective"));
      }
    }
  }

  const int rank_, world_, device_;
  const NcclCommOptions o_;
  double grace_s_ = 1.0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t producer_ = nullptr;
  cudaEvent_t producer_ready_ = nullptr;
  void* barrier_buf_ = nullptr;
  std::unique_ptr<CopyEngineAllReduce> copy_engine_;  // EnableCopyEngineAllReduce
  struct SymmetricMemory {
    void* ptr;
    ncclWindow_t win;  // null where NCCL has no symmetric kernels for these ranks
  };
  std::vector<SymmetricMemory> memory_;       // AllocSymmetric's, freed with the comm
  std::atomic<CommTimeSink*> sink_{nullptr};  // written under mu_
  std::atomic<CollectiveOp> last_op_{CollectiveOp::kBarrier};

  std::mutex mu_;  // guards the NCCL/CUDA calls on comm_ and everything below
  uint64_t next_seq_ = 1;
  std::deque<std::shared_ptr<Op>> pending_;  // issued, not known finished, in issue order
  Status failed_;
  Clock::time_point failed_at_;
  bool failure_taken_ = false;
  bool aborted_ = false;
  bool stop_ = false;
  std::condition_variable cv_;
  std::thread watchdog_;
};

Status NcclWork::Wait() { return comm_->WaitOp(op_); }
bool NcclWork::Ready() { return comm_->OpReady(op_); }
Status NcclWork::WaitOnStream(void* stream) { return comm_->OpOnStream(op_, stream); }

}  // namespace

int NcclVisibleDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

namespace {

// A non-blocking communicator's creation finishes asynchronously: poll until
// it did, failed, or the timeout passed (ncclInProgress then).
ncclResult_t WaitForInit(ncclComm_t comm, ncclResult_t r, double timeout_s) {
  if (r != ncclInProgress && r != ncclSuccess) return r;
  const auto deadline = Clock::now() + std::chrono::nanoseconds(int64_t(timeout_s * 1e9));
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && Clock::now() < deadline) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) state = ncclInternalError;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return state;
}

}  // namespace

StatusOr<std::unique_ptr<NcclComm>> MakeNcclComm(int rank, int world, IdRendezvous* rendezvous,
                                                 const NcclCommOptions& options) {
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(world);
  if (world < 1 || rank < 0 || rank >= world) return Status::Invalid("MakeNcclComm: bad " + who);
  if (!(options.timeout_s > 0)) return Status::Invalid("parallel.collective_timeout_s must be > 0");
  int device = options.device;
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess)
    return Status::Unavailable(who + ": no CUDA device");
  if (device >= NcclVisibleDevices())
    return Status::Unavailable(who + ": CUDA device " + std::to_string(device) + " is not visible");
  DeviceGuard g(device);

  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  UniqueIdBytes bytes{};
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      return Status::Unavailable(who + ": ncclGetUniqueId: " + ncclGetErrorString(r));
    static_assert(sizeof(ncclUniqueId) == sizeof(UniqueIdBytes));
    std::memcpy(bytes.data(), &id, sizeof id);
  }
  if (world > 1) {
    if (rendezvous == nullptr) return Status::Invalid(who + ": no rendezvous for the NCCL id");
    FORGE_RETURN_IF_ERROR(rendezvous->Exchange(rank, world, &bytes).Annotate(who + ": NCCL id"));
  }
  std::memcpy(&id, bytes.data(), sizeof id);

  auto impl = std::make_unique<NcclCommImpl>(rank, world, device, options);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return at once; we poll, so init and hangs can time out
  if (options.max_ctas > 0) config.maxCTAs = options.max_ctas;
  if (options.cta_policy >= 0) config.CTAPolicy = options.cta_policy;
  config.commName = impl->comm_name();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
  r = WaitForInit(comm, r, options.timeout_s);
  if (r != ncclSuccess) {
    const std::string detail = r == ncclInProgress ? std::string("timed out (other ranks missing?)")
                                                   : std::string(ncclGetErrorString(r));
    if (comm != nullptr) ncclCommAbort(comm);
    return Status::Unavailable(who + ": ncclCommInitRank on device " + std::to_string(device) +
                               ": " + detail);
  }
  FORGE_RETURN_IF_ERROR(impl->Start(comm).Annotate(who));
  return std::unique_ptr<NcclComm>(std::move(impl));
}

}  // namespace forge

#else  // !FORGE_HAVE_CUDA

namespace forge {

int NcclVisibleDevices() { return 0; }

StatusOr<std::unique_ptr<NcclComm>> MakeNcclComm(int, int, IdRendezvous*, const NcclCommOptions&) {
  return Status::Unavailable("NCCL: built without CUDA");
}

}  // namespace forge

#endif  // FORGE_HAVE_CUDA
