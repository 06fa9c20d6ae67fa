#include "worker/model/rope_frequencies.h"

#include "kernels/cpu/rope.h"

namespace forge {

std::vector<double> RopeFrequencies(const ModelConfig& m) {
  if (m.rope_scaling.type == RopeScalingType::kNone)
    return cpu::RopeInverseFrequencies(m.head_dim(), m.rope_theta, nullptr);
  cpu::Llama3RopeScaling s;
  s.factor = m.rope_scaling.factor;
  s.low_freq_factor = m.rope_scaling.low_freq_factor;
  s.high_freq_factor = m.rope_scaling.high_freq_factor;
  s.original_max_positions = m.rope_scaling.original_max_position_embeddings;
  return cpu::RopeInverseFrequencies(m.head_dim(), m.rope_theta, &s);
}

}  // namespace forge
