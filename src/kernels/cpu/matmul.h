// Linear layer (CPU float32 reference, OpenBLAS sgemm): out[N, O] = x[N, I] * W[O, I]^T.
#pragma once
#include <cstdint>

namespace forge::cpu {

// accumulate=false overwrites out; true adds (used to fold the residual add into the GEMM).
void MatmulForward(float* out, const float* x, const float* w, int64_t N, int I, int O,
                   bool accumulate = false);
// dx (overwritten unless accumulate_dx) [N, I] = dout W; dw += dout^T x ([O, I]).
// Either of dx / dw may be null to skip it.
void MatmulBackward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                    int64_t N, int I, int O, bool accumulate_dx = false);

}  // namespace forge::cpu
