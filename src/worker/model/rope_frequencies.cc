#include "worker/model/rope_frequencies.h"

#include "kernels/cpu/rope.h"

namespace forge {

std::vector<double> RopeFrequencies(const ModelConfig& m) {
  return cpu::RopeInverseFrequencies(m.head_dim(), m.rope_theta, m.rope_scaling);
}

}  // namespace forge
