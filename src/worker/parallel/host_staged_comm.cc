#include "worker/parallel/host_staged_comm.h"

#ifdef FORGE_HAVE_CUDA

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

namespace forge {
namespace {

class HostStagedComm final : public Comm {
 public:
  explicit HostStagedComm(NcclComm* nccl) : nccl_(nccl) {}
  ~HostStagedComm() override {
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  const char* name() const override { return "nccl-host"; }
  int rank() const override { return nccl_->rank(); }
  int world() const override { return nccl_->world(); }

  StatusOr<CommWorkPtr> AllReduceSum(void* buf, int64_t n, DType t,
                                     std::string_view what) override {
    const size_t bytes = Bytes(n, t);
    return Staged(bytes, what, [&](char* d) -> Status {
      FORGE_RETURN_IF_ERROR(In(d, buf, bytes));
      FORGE_RETURN_IF_ERROR(Run(nccl_->AllReduceSum(d, n, t, what)));
      return Out(buf, d, bytes);
    });
  }
  StatusOr<CommWorkPtr> ReduceScatterSum(const void* send, void* recv, int64_t n, DType t,
                                         std::string_view what) override {
    const size_t bytes = Bytes(n, t), all = bytes * world();
    return Staged(all + bytes, what, [&](char* d) -> Status {
      FORGE_RETURN_IF_ERROR(In(d, send, all));
      FORGE_RETURN_IF_ERROR(Run(nccl_->ReduceScatterSum(d, d + all, n, t, what)));
      return Out(recv, d + all, bytes);
    });
  }
  StatusOr<CommWorkPtr> AllGather(const void* send, void* recv, int64_t n, DType t,
                                  std::string_view what) override {
    const size_t bytes = Bytes(n, t), all = bytes * world();
    return Staged(all, what, [&](char* d) -> Status {
      FORGE_RETURN_IF_ERROR(In(d + rank() * bytes, send, bytes));
      FORGE_RETURN_IF_ERROR(Run(nccl_->AllGather(d + rank() * bytes, d, n, t, what)));
      return Out(recv, d, all);
    });
  }
  StatusOr<CommWorkPtr> Broadcast(void* buf, int64_t n, DType t, int root,
                                  std::string_view what) override {
    const size_t bytes = Bytes(n, t);
    return Staged(bytes, what, [&](char* d) -> Status {
      FORGE_RETURN_IF_ERROR(In(d, buf, bytes));
      FORGE_RETURN_IF_ERROR(Run(nccl_->Broadcast(d, n, t, root, what)));
      return Out(buf, d, bytes);
    });
  }
  StatusOr<CommWorkPtr> Barrier(std::string_view what) override {
    FORGE_RETURN_IF_ERROR(Run(nccl_->Barrier(what)));
    return CompletedWork();
  }
  [[noreturn]] void Abort(const Status& why) override {
    nccl_->Abort(why);
    std::abort();  // not reached
  }

 private:
  static size_t Bytes(int64_t n, DType t) { return n > 0 ? size_t(n) * DTypeSize(t) : 0; }
  static Status Run(StatusOr<CommWorkPtr> w) {
    if (!w.ok()) return w.status();
    return (*w)->Wait();
  }
  // Plain cudaMemcpy: synchronous with the host, and the NCCL stream's work is waited for by
  // Run before the copy back.
  static Status In(char* d, const void* h, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    const cudaError_t e = cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? Status::Ok()
                            : Status::Internal(std::string("staging copy: ") + cudaGetErrorString(e));
  }
  static Status Out(void* h, const char* d, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    const cudaError_t e = cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? Status::Ok()
                            : Status::Internal(std::string("staging copy: ") + cudaGetErrorString(e));
  }

  template <typename Body>
  StatusOr<CommWorkPtr> Staged(size_t bytes, std::string_view what, Body body) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(nccl_->device());
    Status st;
    if (bytes > capacity_) {
      if (scratch_ != nullptr) cudaFree(scratch_);
      scratch_ = nullptr;
      capacity_ = 0;
      const cudaError_t e = cudaMalloc(&scratch_, bytes);
      if (e == cudaSuccess) capacity_ = bytes;
      else st = Status::Unavailable("host-staged comm: cudaMalloc " + std::to_string(bytes) +
                                    " bytes for " + std::string(what) + ": " +
                                    cudaGetErrorString(e));
    }
    if (st.ok()) st = body(static_cast<char*>(scratch_));
    cudaSetDevice(previous);
    if (!st.ok()) return st;
    return CompletedWork();
  }

  NcclComm* nccl_;
  void* scratch_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Comm>> MakeHostStagedComm(NcclComm* nccl) {
  if (nccl == nullptr) return Status::Invalid("MakeHostStagedComm: null NCCL comm");
  return std::unique_ptr<Comm>(new HostStagedComm(nccl));
}

}  // namespace forge

#else  // FORGE_HAVE_CUDA

namespace forge {

StatusOr<std::unique_ptr<Comm>> MakeHostStagedComm(NcclComm*) {
  return Status::Unavailable("host-staged comm: built without CUDA");
}

}  // namespace forge

#endif  // FORGE_HAVE_CUDA
