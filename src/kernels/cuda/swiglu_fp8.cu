#include "kernels/cuda/swiglu_fp8.h"

#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/fp8_tile_cast.cuh"
#include "kernels/cuda/swiglu_math.cuh"

namespace forge::cuda {
namespace {

using fp8tile::RoundBf16;

struct SwiGluForwardSource {
  static constexpr int kOut = 1;
  const bf16* gate_up;
  int64_t ffn;
  __device__ __forceinline__ void Load(int64_t r, int64_t c, float (&f)[1][8]) const {
    float g[8], u[8];
    const bf16* gp = gate_up + r * 2 * ffn + c;
    LoadVec<8>(gp, g);
    LoadVec<8>(gp + ffn, u);
#pragma unroll
    for (int e = 0; e < 8; ++e) f[0][e] = RoundBf16(SwiGluOut(g[e], u[e]));
  }
};

// Positions (r, c) of the gate half; output 0 is dgate at column c, output 1 dup at c + ffn.
struct SwiGluBackwardSource {
  static constexpr int kOut = 2;
  const bf16* dout;
  const bf16* gate_up;
  int64_t ffn;
  __device__ __forceinline__ void Load(int64_t r, int64_t c, float (&f)[2][8]) const {
    float g[8], u[8], dy[8];
    const bf16* gp = gate_up + r * 2 * ffn + c;
    LoadVec<8>(gp, g);
    LoadVec<8>(gp + ffn, u);
    LoadVec<8>(dout + r * ffn + c, dy);
    uint32_t packed[2][4];  // unused: the tile kernel takes the amax of f
    SwiGluGradsRounded8(g, u, dy, f, packed);
  }
};

}  // namespace

bool SwiGluFp8Supported(int64_t N, int ffn, const void* in0, const void* in1, const void* out,
                        const void* out_t) {
  return fp8tile::TileShapeOk(N, ffn, out, out_t) && IsAligned(in0, 16) && IsAligned(in1, 16);
}

namespace {

// Both launchers' checks: the shape, the FP8 scale slots, then what the tile kernel takes.
Status CheckArgs(const char* what, int64_t N, int ffn, const void* in0, const void* in1,
                 const void* out, const void* out_t, DType format, const float* scale,
                 const float* amax, const float* scale_inv) {
  if (N < 0 || ffn <= 0)
    return Status::Invalid(std::string(what) + ": bad shape N=" + std::to_string(N) +
                           " ffn=" + std::to_string(ffn));
  FORGE_RETURN_IF_ERROR(CheckFp8CastArgs(what, format, scale, amax, scale_inv));
  if (!SwiGluFp8Supported(N, ffn, in0, in1, out, out_t))
    return Status::Invalid(std::string(what) + ": needs N and ffn multiples of 64 and aligned "
                           "buffers (N=" + std::to_string(N) + " ffn=" + std::to_string(ffn) + ")");
  return Status::Ok();
}

}  // namespace

Status SwiGluForwardFp8(void* out, void* out_t, const bf16* gate_up, int64_t N, int ffn,
                        DType format, const float* scale, float* amax, float* scale_inv,
                        cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckArgs("SwiGluForwardFp8", N, ffn, gate_up, gate_up, out, out_t,
                                  format, scale, amax, scale_inv));
  fp8tile::LaunchTileCast(format == DType::kE4M3, out, out_t,
                          SwiGluForwardSource{gate_up, ffn}, N, ffn, ffn, 0, scale, amax,
                          scale_inv, stream);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status SwiGluBackwardFp8(void* dgate_up, void* dgate_up_t, const bf16* dout,
                         const bf16* gate_up, int64_t N, int ffn, DType format,
                         const float* scale, float* amax, float* scale_inv, cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckArgs("SwiGluBackwardFp8", N, ffn, dout, gate_up, dgate_up,
                                  dgate_up_t, format, scale, amax, scale_inv));
  fp8tile::LaunchTileCast(format == DType::kE4M3, dgate_up, dgate_up_t,
                          SwiGluBackwardSource{dout, gate_up, ffn}, N, ffn, 2 * int64_t{ffn},
                          ffn, scale, amax, scale_inv, stream);
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
