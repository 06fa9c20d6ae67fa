#include "worker/model/init.h"

#include <cmath>
#include <numbers>

#include "kernels/cpu/parallel_for.h"
#include "common/splitmix64.h"

namespace forge {
namespace {

// The 64 random bits of the counter (unit key, element). Depends on nothing else, so any
// thread or shard computes the same value.
uint64_t CounterBits(uint64_t unit_key, uint64_t element) {
  return SplitMix64(unit_key ^ SplitMix64(element));
}

// N(0, 1) from the counter: its bits -> two 32-bit uniforms -> Box-Muller.
float NormalAt(uint64_t unit_key, uint64_t element) {
  const uint64_t r = CounterBits(unit_key, element);
  const double u1 = (double(r >> 32) + 1.0) / 4294967296.0;          // (0, 1]
  const double u2 = double(r & 0xFFFFFFFFull) / 4294967296.0;         // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

// U[-1, 1) from the counter's top 53 bits.
float UniformAt(uint64_t unit_key, uint64_t element) {
  const uint64_t r = CounterBits(unit_key, element);
  return static_cast<float>(double(r >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

}  // namespace

void InitParams(const ModelConfig& m, const ParamLayout& layout, uint64_t seed, UnitBuffers* params) {
  params->resize(layout.units.size());
  const float resid_std = m.init_std / std::sqrt(2.0f * m.n_layer);
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    std::vector<float>& buf = (*params)[u];
    buf.assign(unit.numel, 0.0f);
    const uint64_t unit_key = SplitMix64(seed ^ SplitMix64(0xF0F0'0000ull + u));
    const bool is_block = layout.is_block_unit(static_cast<int>(u));
    for (const TensorSlot& t : unit.tensors) {
      float* p = buf.data() + t.offset;
      if (!t.is_matmul) {  // norm weights
        for (int64_t i = 0; i < t.numel; ++i) p[i] = 1.0f;
        continue;
      }
      const bool residual_out =
          is_block && (t.offset == layout.block.wo || t.offset == layout.block.w_down);
      // torch: nn.Embedding's N(0, 1) and nn.Linear's kaiming_uniform(a = sqrt(5)), i.e.
      // U(+-1/sqrt(fan_in)) with fan_in the matrix's inner dimension ([out, in] row-major); an
      // untied LM head is an nn.Linear.
      const bool torch = m.init == InitScheme::kTorch;
      const bool uniform = torch && (is_block || t.name == "lm_head");
      const float scale = !torch    ? (residual_out ? resid_std : m.init_std)
                          : uniform ? 1.0f / std::sqrt(float(t.shape.back()))
                                    : 1.0f;
      // Keyed by the element's offset in its unit, so chunking cannot change a value.
      cpu::ParallelFor(t.numel, 1 << 16, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const auto key = static_cast<uint64_t>(t.offset + i);
          p[i] = scale * (uniform ? UniformAt(unit_key, key) : NormalAt(unit_key, key));
        }
      });
    }
  }
}

}  // namespace forge
