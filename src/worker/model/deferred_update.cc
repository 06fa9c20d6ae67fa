// See deferred_update.h.
#include "worker/model/deferred_update.h"

#include <string>
#include <utility>

#include "kernels/cuda/cuda_check.h"

namespace forge {

DeferredUpdate::~DeferredUpdate() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : unit_done_) cudaEventDestroy(e);
  if (fork_) cudaEventDestroy(fork_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
  if (pending_) cudaFree(pending_);
  if (hyper_) cudaFree(hyper_);
}

Status DeferredUpdate::Init(const cuda::AdamWTensor* tensors, std::vector<int> first_tensor,
                            std::vector<int64_t> unit_elements, const float* clip_scale,
                            int64_t* skipped_steps, int priority, std::vector<int> order) {
  if (tensors == nullptr || clip_scale == nullptr || unit_elements.empty() ||
      first_tensor.size() != unit_elements.size() + 1) {
    return Status::Invalid("deferred update: bad unit table (" +
                           std::to_string(unit_elements.size()) + " units, " +
                           std::to_string(first_tensor.size()) + " bounds)");
  }
  const int units = static_cast<int>(unit_elements.size());
  if (order.empty()) {
    for (int u = 0; u < units; ++u) order.push_back(u);
  }
  const Status not_permutation = Status::Invalid(
      "deferred update: the order is not a permutation of the " + std::to_string(units) +
      " units");
  if (order.size() != size_t(units)) return not_permutation;
  std::vector<bool> seen(size_t(units), false);
  for (const int u : order) {
    if (u < 0 || u >= units || seen[size_t(u)]) return not_permutation;
    seen[size_t(u)] = true;
  }
  order_ = std::move(order);
  tensors_ = tensors;
  first_tensor_ = std::move(first_tensor);
  unit_elements_ = std::move(unit_elements);
  clip_scale_ = clip_scale;
  skipped_steps_ = skipped_steps;
  FORGE_CUDA_CHECK(cudaMalloc(&pending_, sizeof(int)));
  FORGE_CUDA_CHECK(cudaMemset(pending_, 0, sizeof(int)));
  FORGE_CUDA_CHECK(cudaMalloc(&hyper_, sizeof(cuda::AdamWHyper)));
  FORGE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  unit_done_.assign(unit_elements_.size(), nullptr);
  for (cudaEvent_t& e : unit_done_) {
    FORGE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return Status::Ok();
}

Status DeferredUpdate::Defer(const cuda::AdamWHyper* hyper, cudaStream_t s) {
  FORGE_CUDA_CHECK(
      cudaMemcpyAsync(hyper_, hyper, sizeof(cuda::AdamWHyper), cudaMemcpyDeviceToDevice, s));
  FORGE_RETURN_IF_ERROR(cuda::MarkUpdatePending(clip_scale_, pending_, skipped_steps_, s));
  used_ = true;
  return Status::Ok();
}

// Units [first_unit, last_unit] in one gated launch. The skip was counted by Defer, so no
// counter here (a non-finite clip scale never sets the flag).
Status DeferredUpdate::Launch(int first_unit, int last_unit, cudaStream_t s) {
  const int begin = first_tensor_[size_t(first_unit)];
  const int end = first_tensor_[size_t(last_unit) + 1];
  int64_t elements = 0;
  for (int u = first_unit; u <= last_unit; ++u) elements += unit_elements_[size_t(u)];
  return cuda::AdamWMultiTensor(tensors_ + begin, end - begin, hyper_, clip_scale_, s,
                                /*skipped_steps=*/nullptr, pending_, elements);
}

Status DeferredUpdate::Begin(cudaStream_t s, bool overlap) {
  if (!used_ || open_) return Status::Ok();
  if (!overlap) return Flush(s);
  FORGE_CUDA_CHECK(cudaEventRecord(fork_, s));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
  open_ = true;
  for (const int u : order_) {
    FORGE_RETURN_IF_ERROR(Launch(u, u, stream_).Annotate("deferred update of unit " +
                                                         std::to_string(u)));
    FORGE_CUDA_CHECK(cudaEventRecord(unit_done_[size_t(u)], stream_));
  }
  // Every unit read the flag before this (same stream): the update is applied.
  FORGE_CUDA_CHECK(cudaMemsetAsync(pending_, 0, sizeof(int), stream_));
  return Status::Ok();
}

Status DeferredUpdate::WaitUnit(int unit, cudaStream_t s) {
  if (!open_) return Status::Ok();
  if (unit < 0 || unit >= static_cast<int>(unit_done_.size())) {
    return Status::Invalid("deferred update: no unit " + std::to_string(unit));
  }
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(s, unit_done_[size_t(unit)], 0));
  return Status::Ok();
}

Status DeferredUpdate::End(cudaStream_t s) {
  if (!open_) return Status::Ok();
  open_ = false;
  FORGE_CUDA_CHECK(cudaEventRecord(done_, stream_));
  FORGE_CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
  return Status::Ok();
}

Status DeferredUpdate::Flush(cudaStream_t s) {
  if (!used_) return Status::Ok();
  if (open_) return End(s);
  FORGE_RETURN_IF_ERROR(Launch(0, static_cast<int>(unit_elements_.size()) - 1, s));
  FORGE_CUDA_CHECK(cudaMemsetAsync(pending_, 0, sizeof(int), s));
  return Status::Ok();
}

}  // namespace forge
