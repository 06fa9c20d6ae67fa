#include "worker/parallel/sum_order.h"

#include <algorithm>
#include <vector>

namespace forge {
namespace {

template <typename T>
void Sum(T* out, T* const* parts, int n, int64_t count) {
  if (n <= 0) return;
  // Slots point at the parts themselves: leaf(i, s) aims slot s at part i, add sums in place.
  std::vector<T*> slot(CanonicalSumSlots(n), nullptr);
  CanonicalReduce(
      n, [&](int64_t i, int s) { slot[s] = parts[i]; },
      [&](int d, int s) {
        T* a = slot[d];
        const T* b = slot[s];
        for (int64_t e = 0; e < count; ++e) a[e] += b[e];
      });
  if (slot[0] != out) std::copy(slot[0], slot[0] + count, out);
}

}  // namespace

void CanonicalSum(float* out, float* const* parts, int n, int64_t count) {
  Sum(out, parts, n, count);
}
void CanonicalSum(double* out, double* const* parts, int n, int64_t count) {
  Sum(out, parts, n, count);
}

}  // namespace forge
