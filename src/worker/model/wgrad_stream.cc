// The backward's second stream: weight-gradient GEMMs forked off the compute stream, the
// hazard events that order them against the chain, and the join.
#include "worker/model/cuda_model.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "worker/model/cuda_model_state.h"

namespace forge {

using cuda::GemmArgs;

// Every weight-gradient GEMM runs on gemm_w; with the wgrad stream it runs there, forked right
// after its inputs were enqueued on the compute stream (the fork event orders it after
// everything enqueued so far, which also covers the previous step's optimizer reading the
// gradient it overwrites). Each GEMM is the same call as single-stream (same runner, shapes,
// alignment, so the same plan), and the GEMMs that add into one gradient (dWte chunks, then
// the embedding backward; micro-steps) stay in their order, so the gradients are bitwise the
// same. What the two streams must not race on is spelled out where each wait is issued; the
// general rules: the wgrad stream only reads activations and gradient scratch and only writes
// gradient tensors no chain kernel touches (except the tied dWte, see kDwte), and
// ForwardBackward joins the wgrad stream back before it returns, so the next micro-step's
// forward, the optimizer, host reads and EndCapture all come after every dW GEMM.

Status CudaModel::WgradGemm(const GemmArgs& g, WgradHazard reads, cudaStream_t s) {
  Buffers& b = *buf_;
  if (!dual_) return b.gemm_w.Run(g, s);
  FORGE_CUDA_CHECK(cudaEventRecord(b.fork, s));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(b.wgrad, b.fork, 0));
  wgrad_pending_ = true;  // from here on the wgrad stream must be joined back
  FORGE_RETURN_IF_ERROR(b.gemm_w.Run(g, b.wgrad));
  return RecordWgrad(reads);
}

Status CudaModel::RecordWgrad(WgradHazard h) {
  if (!dual_) return Status::Ok();
  const int i = static_cast<int>(h);
  FORGE_CUDA_CHECK(cudaEventRecord(buf_->hazard[i], buf_->wgrad));
  hazard_recorded_[i] = true;
  return Status::Ok();
}

Status CudaModel::WaitWgrad(WgradHazard h, cudaStream_t s) {
  const int i = static_cast<int>(h);
  if (!dual_ || !hazard_recorded_[i]) return Status::Ok();
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(s, buf_->hazard[i], 0));
  return Status::Ok();
}

Status CudaModel::JoinWgrad(cudaStream_t s) {
  if (!dual_ || !wgrad_pending_) return Status::Ok();
  FORGE_CUDA_CHECK(cudaEventRecord(buf_->join, buf_->wgrad));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(s, buf_->join, 0));
  wgrad_pending_ = false;
  return Status::Ok();
}

}  // namespace forge
