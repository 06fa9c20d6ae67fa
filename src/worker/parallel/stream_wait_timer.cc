#ifdef FORGE_HAVE_CUDA

#include "worker/parallel/stream_wait_timer.h"

#include <string>

namespace forge {
namespace {

Status CudaStatus(cudaError_t e, const char* what) {
  return Status::Internal(std::string("stream wait timer: ") + what + ": " +
                          cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace

StreamWaitTimer::~StreamWaitTimer() {
  for (Pair& p : free_) {
    cudaEventDestroy(p.before);
    cudaEventDestroy(p.after);
  }
  for (Pair& p : pending_) {
    cudaEventDestroy(p.before);
    cudaEventDestroy(p.after);
  }
}

Status StreamWaitTimer::Wait(cudaStream_t stream, cudaEvent_t event, CollectiveOp op,
                             bool timed) {
  if (!timed) {
    const cudaError_t e = cudaStreamWaitEvent(stream, event, 0);
    return e == cudaSuccess ? Status::Ok() : CudaStatus(e, "cudaStreamWaitEvent");
  }
  Pair p;
  if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
  } else {
    cudaError_t e = cudaEventCreate(&p.before);
    if (e == cudaSuccess) e = cudaEventCreate(&p.after);
    if (e != cudaSuccess) {
      if (p.before) cudaEventDestroy(p.before);
      return CudaStatus(e, "cudaEventCreate");
    }
  }
  p.op = op;
  cudaError_t e = cudaEventRecord(p.before, stream);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(stream, event, 0);
  if (e == cudaSuccess) e = cudaEventRecord(p.after, stream);
  if (e != cudaSuccess) {
    free_.push_back(p);
    return CudaStatus(e, "timed wait");
  }
  pending_.push_back(p);
  return Status::Ok();
}

void StreamWaitTimer::Collect(CommTimeSink* sink) {
  while (!pending_.empty()) {
    Pair& p = pending_.front();
    if (cudaEventQuery(p.after) != cudaSuccess) break;  // later ones are later on the stream
    float ms = 0.0f;
    if (sink != nullptr && cudaEventElapsedTime(&ms, p.before, p.after) == cudaSuccess)
      sink->AddExposedWaitSeconds(p.op, double(ms) * 1e-3);
    free_.push_back(p);
    pending_.pop_front();
  }
}

}  // namespace forge

#endif  // FORGE_HAVE_CUDA
