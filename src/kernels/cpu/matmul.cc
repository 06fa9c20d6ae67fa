#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <cstring>

namespace forge::cpu {

void MatmulForward(float* out, const float* x, const float* w, int64_t N, int I, int O,
                   bool accumulate) {
  if (N == 0 || O == 0) return;
  if (I == 0) {
    if (!accumulate) std::memset(out, 0, sizeof(float) * N * O);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(N), O, I, 1.0f, x, I,
              w, I, accumulate ? 1.0f : 0.0f, out, O);
}

void MatmulBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                    int64_t N, int I, int O, bool accumulate_dx) {
  if (N == 0 || I == 0) return;
  if (dx) {
    if (O == 0) {
      if (!accumulate_dx) std::memset(dx, 0, sizeof(float) * N * I);
    } else {
      // dx[N, I] = dout[N, O] W[O, I]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(N), I, O, 1.0f,
                  dout, O, w, I, accumulate_dx ? 1.0f : 0.0f, dx, I);
    }
  }
  if (dw && O > 0) {
    // dw[O, I] += dout[N, O]^T x[N, I]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, static_cast<blasint>(N), 1.0f, dout,
                O, x, I, 1.0f, dw, I);
  }
}

}  // namespace forge::cpu
