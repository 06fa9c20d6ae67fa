// SwiGLU (CPU float32 reference): out = silu(gate) * up, gate/up the two halves of each row of
// the fused gate_up projection ([N, 2*ffn]: gate in [0, ffn), up in [ffn, 2*ffn)).
#pragma once
#include <cstdint>

namespace forge::cpu {

void SwiGluForward(float* out, const float* gate_up, int64_t N, int ffn);
// dgate_up (overwritten): [N, 2*ffn]
void SwiGluBackward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int ffn);

}  // namespace forge::cpu
