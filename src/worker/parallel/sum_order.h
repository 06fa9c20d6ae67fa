// The canonical order in which Forge sums gradients on the CPU, over micro-steps and ranks
// alike, so that data-parallel training is bitwise identical to one process:
//
//   S(x_0) = x_0;   S(x_0 .. x_{n-1}) = S(x_0, x_2, x_4, ...) + S(x_1, x_3, x_5, ...)
//
// i.e. a pairwise tree over the even positions, then the odd ones. Why: the sampler
// (data/sampler.h) gives rank r of W the global micro-steps j = k*W + r. For W a power of two,
// W-1 levels of the even/odd split separate exactly those residue classes, so
//   S(all A micro-steps) = S over ranks r of S(micro-steps of rank r)
// operation for operation: each rank sums its own micro-steps with S, and the collective sums
// the W partial results with S over rank index. (With one micro-step per rank, any W works.)
// Float addition is commutative, so only the tree shape matters, not which side is "left".
#pragma once

#include <cstdint>

namespace forge {

// Evaluates S over n >= 1 leaves using scratch slots 0 .. CanonicalSumSlots(n)-1:
//   leaf(i, s) must put x_i into slot s; add(d, s) must do slot[d] += slot[s].
// The result ends in slot 0. Leaves are produced depth-first, one at a time, so the caller
// needs only ceil(log2 n) + 1 buffers however many leaves there are.
template <typename Leaf, typename Add>
void CanonicalReduce(int64_t n, Leaf&& leaf, Add&& add) {
  struct Rec {
    Leaf& leaf;
    Add& add;
    void Run(int64_t start, int64_t stride, int64_t count, int slot) {
      if (count == 1) {
        leaf(start, slot);
        return;
      }
      Run(start, 2 * stride, (count + 1) / 2, slot);         // even positions
      Run(start + stride, 2 * stride, count / 2, slot + 1);  // odd positions
      add(slot, slot + 1);
    }
  };
  if (n >= 1) Rec{leaf, add}.Run(0, 1, n, 0);
}

// Slots CanonicalReduce(n, ...) uses: ceil(log2 n) + 1 (1 for n <= 1).
inline int CanonicalSumSlots(int64_t n) {
  int slots = 1;
  for (int64_t span = 1; span < n; span *= 2) ++slots;
  return slots;
}

// out[e] = S(parts[0][e], ..., parts[n-1][e]) for e < count. Clobbers the parts (they are
// summed in place); out may alias parts[0].
void CanonicalSum(float* out, float* const* parts, int n, int64_t count);
void CanonicalSum(double* out, double* const* parts, int n, int64_t count);

}  // namespace forge
