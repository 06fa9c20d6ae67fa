#include "worker/train/cuda_model_support.h"

#include <string>

namespace forge {
namespace {

Status Unsupported(const std::string& key, const std::string& what) {
  return Status::Invalid(key + ": " + what +
                         " is not supported by the cuda backend yet (train.backend: cpu runs "
                         "it on the CPU reference)");
}

}  // namespace

Status CheckCudaSupportsModel(const ModelConfig& m) {
  if (m.explicit_head_dim != 0 &&
      (m.n_head <= 0 || m.d_model % m.n_head != 0 || m.explicit_head_dim != m.d_model / m.n_head))
    return Unsupported("model.head_dim", std::to_string(m.explicit_head_dim) +
                                             " (attention width n_head x head_dim = " +
                                             std::to_string(int64_t{m.n_head} * m.explicit_head_dim) +
                                             " other than model.d_model " +
                                             std::to_string(m.d_model) + ")");
  if (!m.tie_embeddings)
    return Unsupported("model.tie_embeddings", "false (an LM head apart from the embedding)");
  if (m.rope_scaling.type != RopeScalingType::kNone)
    return Unsupported("model.rope_scaling",
                       std::string("type ") + RopeScalingTypeName(m.rope_scaling.type) +
                           " (RoPE frequency scaling)");
  if (m.qk_norm) return Unsupported("model.qk_norm", "true (RMSNorm of each query and key head)");
  return Status::Ok();
}

}  // namespace forge
