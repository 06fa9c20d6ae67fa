// Softmax cross-entropy over the (padded) vocabulary (CPU float32 reference).
#pragma once
#include <cstdint>

namespace forge::cpu {

// logits: [N, V]. losses[n] = -log softmax(logits[n])[targets[n]].
// If dlogits is non-null it receives (softmax - onehot) * dloss (dloss = weight of each
// token's loss in the total, e.g. 1/(N*accum)); it may alias logits.
void CrossEntropyForwardBackward(float* losses, float* dlogits, const float* logits,
                                 const int32_t* targets, int64_t N, int V, float dloss);

}  // namespace forge::cpu
