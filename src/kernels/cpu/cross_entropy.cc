#include "kernels/cpu/cross_entropy.h"

#include <cmath>

#include "kernels/cpu/parallel_for.h"

namespace forge::cpu {

void CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits,
                                 const int32_t* targets, int64_t N, int V, float dloss) {
  // Rows are independent: each is computed whole by one thread.
  ParallelFor(N, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const float* l = logits + n * V;
      const int tgt = targets[n];
      float mx = -INFINITY;
      for (int j = 0; j < V; ++j) mx = std::max(mx, l[j]);
      double sum = 0.0;
      for (int j = 0; j < V; ++j) sum += std::exp(l[j] - mx);
      const double lse = std::log(sum) + mx;
      // Read the target logit before dlogits (which may alias logits) overwrites it.
      losses[n] = static_cast<float>(lse - l[tgt]);
      if (dlogits) {
        float* dl = dlogits + n * V;
        const float inv = static_cast<float>(1.0 / sum);
        for (int j = 0; j < V; ++j) dl[j] = std::exp(l[j] - mx) * inv * dloss;
        dl[tgt] -= dloss;
      }
    }
  });
}

}  // namespace forge::cpu
