// StepPhaseName (step_observer.h) and PhaseTimeline (phase_timeline.h).
#include "worker/model/phase_timeline.h"

#include "kernels/cuda/cuda_check.h"

namespace forge {

const char* StepPhaseName(StepPhase p) {
  switch (p) {
    case StepPhase::kCopy: return "copy";
    case StepPhase::kFwdGemm: return "fwd_gemm";
    case StepPhase::kFwdAttention: return "fwd_attention";
    case StepPhase::kFwdElementwise: return "fwd_elementwise";
    case StepPhase::kLmHeadGemm: return "lm_head_gemm";
    case StepPhase::kCrossEntropy: return "cross_entropy";
    case StepPhase::kBwdGemm: return "bwd_gemm";
    case StepPhase::kBwdAttention: return "bwd_attention";
    case StepPhase::kBwdElementwise: return "bwd_elementwise";
    case StepPhase::kOptimizer: return "optimizer";
    case StepPhase::kCount: break;
  }
  return "?";
}

PhaseTimeline::~PhaseTimeline() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

Status PhaseTimeline::OnPhase(StepPhase phase, cudaStream_t stream) {
  if (marks_ == events_.size()) {
    cudaEvent_t e;
    FORGE_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    phases_.push_back(-1);
  }
  phases_[marks_] = static_cast<int>(phase);
  FORGE_CUDA_CHECK(cudaEventRecord(events_[marks_], stream));
  ++marks_;
  return Status::Ok();
}

Status PhaseTimeline::End(cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(OnPhase(StepPhase::kCount, stream));
  phases_[marks_ - 1] = -1;
  return Status::Ok();
}

Status PhaseTimeline::Totals(std::array<double, static_cast<int>(StepPhase::kCount)>* ms) const {
  ms->fill(0.0);
  if (marks_ == 0) return Status::Ok();
  FORGE_CUDA_CHECK(cudaEventSynchronize(events_[marks_ - 1]));
  for (size_t i = 0; i + 1 < marks_; ++i) {
    if (phases_[i] < 0) continue;
    float t = 0.0f;
    FORGE_CUDA_CHECK(cudaEventElapsedTime(&t, events_[i], events_[i + 1]));
    (*ms)[phases_[i]] += t;
  }
  return Status::Ok();
}

}  // namespace forge
