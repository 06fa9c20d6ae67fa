#include "thread_nccl_comm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace forge {
namespace {

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBf16(float f) {  // round to nearest even; the sums here are finite
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

Status CudaError(cudaError_t e, const char* what) {
  return Status::Internal(std::string("thread comm: ") + what + ": " + cudaGetErrorString(e));
}

// What one rank brings to a collective.
struct Post {
  CollectiveOp op = CollectiveOp::kBarrier;
  DType dtype = DType::kF32;
  int64_t count = 0;  // elements of `bytes`
  int root = 0;
  int color = 0, key = 0;  // Split
  std::vector<unsigned char> bytes;
};

class DoneWork final : public CommWork {
 public:
  Status Wait() override { return Status::Ok(); }
  bool Ready() override { return true; }
};

}  // namespace

class ThreadRankGroup {
 public:
  ThreadRankGroup(int world, double timeout_s) : world_(world), timeout_s_(timeout_s), posts_(world) {}

  int world() const { return world_; }
  double timeout_s() const { return timeout_s_; }
  Post& post(int rank) { return posts_[rank]; }
  const std::vector<Post>& posts() const { return posts_; }

  // Returns once every rank has called it as often as this one (a generation barrier).
  Status Meet(int rank, const std::string& what) {
    std::unique_lock<std::mutex> l(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::Ok();
    }
    if (!cv_.wait_for(l, std::chrono::duration<double>(timeout_s_),
                      [&] { return generation_ != gen; })) {
      return Status::Unavailable("thread comm: rank " + std::to_string(rank) + " waited " +
                                      std::to_string(timeout_s_) + " s for the other ranks at " +
                                      what);
    }
    return Status::Ok();
  }

  // The group of `color` made by the split numbered `seq` of this group (made once).
  std::shared_ptr<ThreadRankGroup> Part(uint64_t seq, int color, int world) {
    std::lock_guard<std::mutex> l(mu_);
    auto& g = parts_[{seq, color}];
    if (!g) g = std::make_shared<ThreadRankGroup>(world, timeout_s_);
    return g;
  }

 private:
  const int world_;
  const double timeout_s_;
  std::vector<Post> posts_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::map<std::pair<uint64_t, int>, std::shared_ptr<ThreadRankGroup>> parts_;
};

std::shared_ptr<ThreadRankGroup> MakeThreadRankGroup(int world, double timeout_s) {
  return std::make_shared<ThreadRankGroup>(world, timeout_s);
}

namespace {

class ThreadNcclComm final : public NcclComm {
 public:
  ThreadNcclComm(std::shared_ptr<ThreadRankGroup> g, int rank, int device, cudaStream_t s)
      : group_(std::move(g)), rank_(rank), device_(device), stream_(s) {}
  ~ThreadNcclComm() override {
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "threads"; }
  int rank() const override { return rank_; }
  int world() const override { return group_->world(); }
  void* stream() const override { return stream_; }
  void SetProducerStream(void* s) override { producer_ = static_cast<cudaStream_t>(s); }
  int device() const override { return device_; }
  Status EnableCopyEngineAllReduce(float*, int64_t, int64_t) override {
    return Status::Precondition("thread comm: no copy-engine all-reduce");
  }
  void SetTimeSink(CommTimeSink* sink) override { sink_ = sink; }
  CommTimeSink* time_sink() const override { return sink_; }
  CollectiveOp last_op() const override { return last_op_; }
  void CountFinished() override {}
  [[noreturn]] void Abort(const Status& why) override {  // the test process is the job
    std::fprintf(stderr, "thread comm: rank %d aborts the job: %s\n", rank_, why.ToString().c_str());
    std::abort();
  }

  StatusOr<CommWorkPtr> AllReduceSum(void* buf, int64_t n, DType t, std::string_view) override {
    return Run(CollectiveOp::kAllReduce, t, buf, n, buf, n, 0);
  }
  StatusOr<CommWorkPtr> ReduceScatterSum(const void* send, void* recv, int64_t n, DType t,
                                         std::string_view) override {
    return Run(CollectiveOp::kReduceScatter, t, send, n * world(), recv, n, 0);
  }
  StatusOr<CommWorkPtr> AllGather(const void* send, void* recv, int64_t n, DType t,
                                  std::string_view) override {
    return Run(CollectiveOp::kAllGather, t, send, n, recv, n * world(), 0);
  }
  StatusOr<CommWorkPtr> Broadcast(void* buf, int64_t n, DType t, int root,
                                  std::string_view) override {
    return Run(CollectiveOp::kBroadcast, t, buf, n, buf, n, root);
  }
  StatusOr<CommWorkPtr> Barrier(std::string_view) override {
    return Run(CollectiveOp::kBarrier, DType::kF32, nullptr, 0, nullptr, 0, 0);
  }

  StatusOr<std::unique_ptr<NcclComm>> SplitNccl(int color, int key,
                                                std::string_view what) override {
    FORGE_RETURN_IF_ERROR(Drain());
    Post& mine = group_->post(rank_);
    mine = Post{};
    mine.op = CollectiveOp::kBarrier;
    mine.color = color;
    mine.key = key;
    FORGE_RETURN_IF_ERROR(group_->Meet(rank_, std::string(what)));
    std::vector<std::pair<int, int>> members;  // (key, rank) of this color
    for (int r = 0; r < world(); ++r) {
      const Post& p = group_->posts()[r];
      if (p.color == color) members.push_back({p.key, r});
    }
    std::sort(members.begin(), members.end());
    int part_rank = 0;
    while (members[part_rank].second != rank_) ++part_rank;
    auto part = group_->Part(splits_++, color, int(members.size()));
    FORGE_RETURN_IF_ERROR(group_->Meet(rank_, std::string(what)));
    return MakeThreadNcclComm(part, part_rank, device_);
  }

 private:
  Status Drain() {
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess && producer_ != nullptr) e = cudaStreamSynchronize(producer_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
    return e == cudaSuccess ? Status::Ok() : CudaError(e, "draining the streams");
  }

  // On the communicator's stream, waited for: a plain cudaMemcpy from pageable memory may return
  // before the bytes reach the device, and runs on the legacy stream, which the (non-blocking)
  // streams that read the result next do not wait for.
  Status Copy(void* dst, const void* src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
    return e == cudaSuccess ? Status::Ok() : CudaError(e, "copying a buffer");
  }

  // send: send_n elements; recv: recv_n elements (both device pointers, may alias).
  StatusOr<CommWorkPtr> Run(CollectiveOp op, DType t, const void* send, int64_t send_n,
                            void* recv, int64_t recv_n, int root) {
    last_op_ = op;
    const std::string what = std::string(CollectiveName(op)) + " #" + std::to_string(seq_++);
    FORGE_RETURN_IF_ERROR(Drain());
    const size_t esize = size_t(DTypeSize(t));
    Post& mine = group_->post(rank_);
    mine.op = op;
    mine.dtype = t;
    mine.count = send_n;
    mine.root = root;
    mine.bytes.resize(size_t(send_n) * esize);
    if (send_n > 0) FORGE_RETURN_IF_ERROR(Copy(mine.bytes.data(), send, mine.bytes.size()));
    FORGE_RETURN_IF_ERROR(group_->Meet(rank_, what));
    const std::vector<Post>& all = group_->posts();
    for (int r = 0; r < world(); ++r) {
      if (all[r].op != op || all[r].dtype != t || all[r].count != send_n || all[r].root != root) {
        return Status::Internal("thread comm: rank " + std::to_string(r) + " issued another " +
                                "collective than rank " + std::to_string(rank_) + "'s " + what);
      }
    }
    std::vector<unsigned char> out(size_t(recv_n) * esize);
    switch (op) {
      case CollectiveOp::kAllReduce:
      case CollectiveOp::kReduceScatter: {
        const int64_t first = op == CollectiveOp::kAllReduce ? 0 : int64_t(rank_) * recv_n;
        Sum(all, t, first, recv_n, out.data());
        break;
      }
      case CollectiveOp::kAllGather:
        for (int r = 0; r < world(); ++r)
          std::memcpy(out.data() + size_t(r) * all[r].bytes.size(), all[r].bytes.data(),
                      all[r].bytes.size());
        break;
      case CollectiveOp::kBroadcast:
        out = all[root].bytes;
        break;
      case CollectiveOp::kBarrier:
        break;
    }
    FORGE_RETURN_IF_ERROR(group_->Meet(rank_, what));  // everyone has read the posts
    if (recv_n > 0) FORGE_RETURN_IF_ERROR(Copy(recv, out.data(), out.size()));
    return CommWorkPtr(std::make_unique<DoneWork>());
  }

  // out[i] = sum over ranks in rank order of element first + i.
  static void Sum(const std::vector<Post>& all, DType t, int64_t first, int64_t n, void* out) {
    for (int64_t i = 0; i < n; ++i) {
      const size_t at = size_t(first + i);
      if (t == DType::kF32) {
        float s = 0;
        for (const Post& p : all) s += reinterpret_cast<const float*>(p.bytes.data())[at];
        static_cast<float*>(out)[i] = s;
      } else if (t == DType::kF64) {
        double s = 0;
        for (const Post& p : all) s += reinterpret_cast<const double*>(p.bytes.data())[at];
        static_cast<double*>(out)[i] = s;
      } else {
        float s = 0;
        for (const Post& p : all) s += Bf16ToFloat(reinterpret_cast<const uint16_t*>(p.bytes.data())[at]);
        static_cast<uint16_t*>(out)[i] = FloatToBf16(s);
      }
    }
  }

  std::shared_ptr<ThreadRankGroup> group_;
  const int rank_;
  const int device_;
  cudaStream_t stream_;
  cudaStream_t producer_ = nullptr;
  CommTimeSink* sink_ = nullptr;
  CollectiveOp last_op_ = CollectiveOp::kBarrier;
  uint64_t seq_ = 0;
  uint64_t splits_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<NcclComm>> MakeThreadNcclComm(std::shared_ptr<ThreadRankGroup> group,
                                                       int rank, int device) {
  cudaError_t e = cudaSetDevice(device);
  cudaStream_t s = nullptr;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return CudaError(e, "creating the stream");
  return std::unique_ptr<NcclComm>(
      std::make_unique<ThreadNcclComm>(std::move(group), rank, device, s));
}

}  // namespace forge
