// Token embedding forward/backward (bf16 activations, fp32 weight gradient).
//
// Bytes moved and design (bandwidth-bound):
// - Forward: reads N*d*2 (gathered rows of wte) + 4N (tokens), writes N*d*2. One thread per
//   16-byte vector of 8 columns, so every warp reads/writes 512 contiguous bytes of a row.
// - Backward: reads N*d*2 (dout, gathered in sorted order) + U*d*4 and writes U*d*4 (the
//   U distinct tokens' dwte rows, read-modify-write), plus the sort (a few passes over 8N
//   bytes of (token, position) pairs). Deterministic without float atomics:
//     1. positions 0..N-1 are paired with their token and stably radix-sorted by token
//        (cub::DeviceRadixSort, LSD, hence stable: equal tokens stay in position order;
//        tokens outside [0, vocab) are keyed `vocab`, sorted last and ignored);
//     2. one warp per (sorted entry, 256-column slice) that starts a run of equal tokens
//        walks the run in order, adding dout rows to an fp32 accumulator seeded with the
//        current dwte row, then writes it back once. Each dwte element therefore sees
//        exactly the additions of the CPU reference, in the same order: the result is
//        bitwise equal to cpu::EmbeddingBackward on the same (bf16-valued) inputs.
//   Four rows of a run are loaded before they are added, to keep loads in flight on long
//   runs (frequent tokens); the addition order is unchanged.
// - Sharded (fsdp's table in fp32 slots, one a rank): the forward writes each rank's part of
//   the rows of all ranks' tokens (-0 where its slot has nothing; the ranks' parts are then
//   summed by a reduce-scatter), the backward walks the same sorted runs over every rank's
//   rows but adds only the elements of this rank's slot, each rank's rows first, then the
//   ranks' sums in rank order.
// Vector paths need d % 8 == 0 and 16-byte aligned pointers; otherwise a scalar path runs.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/grid_stride.cuh"
#include "kernels/cuda/embedding.h"

namespace forge::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kRunUnroll = 4;

// One thread per 8 columns of one token (vector path) or per column (scalar path).
template <int VEC>
__global__ void EmbeddingForwardKernel(bf16* __restrict__ out, const int32_t* __restrict__ tokens,
                                       const bf16* __restrict__ wte, int64_t N, int d) {
  ForEachRowGroup<VEC>(N, d, [&](int64_t n, int64_t c) {
    const int64_t tok = tokens[n];
    if constexpr (VEC == 8) {
      Store16(out + n * d + c, Load16(wte + tok * d + c));
    } else {
      out[n * d + c] = wte[tok * d + c];
    }
  });
}

// Sort input: key = token (out-of-range tokens become `vocab`, sorted last and skipped), value =
// position.
__global__ void PrepareSortKernel(uint32_t* __restrict__ keys, int32_t* __restrict__ positions,
                                  const int32_t* __restrict__ tokens, int n, int vocab) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int32_t t = tokens[i];
    keys[i] = (t >= 0 && t < vocab) ? static_cast<uint32_t>(t) : static_cast<uint32_t>(vocab);
    positions[i] = i;
  }
}

// Warp w of block (x, y) owns sorted entry i = x * kWarpsPerBlock + w and the column slice
// starting at (y * 32 + lane) * VEC. Only warps at the start of a run of equal tokens work: false
// for the others, for out-of-range tokens and for slices past d.
template <int VEC>
__device__ __forceinline__ bool RunStart(const uint32_t* __restrict__ sorted_tok, int N, int d,
                                         int vocab, int* i, uint32_t* tok, int64_t* col) {
  *i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (*i >= N) return false;
  *tok = sorted_tok[*i];
  if (*i > 0 && sorted_tok[*i - 1] == *tok) return false;  // inside a run: its first entry
  if (*tok >= static_cast<uint32_t>(vocab)) return false;  // out-of-range tokens: no update
  *col = (int64_t{blockIdx.y} * 32 + threadIdx.x % 32) * VEC;
  return *col < d;
}

// T: the gradient's element type (float, or bf16: the row read, summed in fp32, rounded once).
template <int VEC, typename T>
__global__ void EmbeddingBackwardKernel(T* __restrict__ dwte, const bf16* __restrict__ dout,
                                        const uint32_t* __restrict__ sorted_tok,
                                        const int32_t* __restrict__ sorted_pos, int N, int d,
                                        int vocab) {
  int i = 0;
  uint32_t tok = 0;
  int64_t col = 0;
  if (!RunStart<VEC>(sorted_tok, N, d, vocab, &i, &tok, &col)) return;

  T* dst = dwte + int64_t{tok} * d + col;
  float acc[VEC];
  if constexpr (std::is_same_v<T, bf16>) {
    LoadVec<VEC>(dst, acc);
  } else if constexpr (VEC == 8) {
    const float4 a = reinterpret_cast<const float4*>(dst)[0];
    const float4 b = reinterpret_cast<const float4*>(dst)[1];
    acc[0] = a.x, acc[1] = a.y, acc[2] = a.z, acc[3] = a.w;
    acc[4] = b.x, acc[5] = b.y, acc[6] = b.z, acc[7] = b.w;
  } else {
    acc[0] = dst[0];
  }

  for (int j = i;; j += kRunUnroll) {
    float rows[kRunUnroll][VEC];
    bool have[kRunUnroll];
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) {
      const int jj = j + u;
      have[u] = jj < N && sorted_tok[jj] == tok;
      if (have[u]) LoadVec<VEC>(dout + int64_t{sorted_pos[jj]} * d + col, rows[u]);
    }
    // Runs are contiguous, so have[] is true then false: adds happen in position order.
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) {
      if (have[u]) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] += rows[u][k];
      }
    }
    if (!have[kRunUnroll - 1]) break;
  }
  if constexpr (std::is_same_v<T, bf16>) {
    StoreVec<VEC>(dst, acc);
  } else if constexpr (VEC == 8) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  } else {
    dst[0] = acc[0];
  }
}

// The lookup from one rank's slot of the table (elements [lo, hi) of the flat [vocab, d] table,
// fp32, at slot[e - lo]): each element of out[n, :] = wte[tokens[n], :] the slot holds, rounded
// to bf16 as the gathered table is, and -0 for the others, so that summing the ranks' outputs
// (which own disjoint slots) adds to each element its one value and zeros: x + -0 is x for
// every x, -0 included.
template <int VEC>
__global__ void EmbeddingRowsFromSlotKernel(bf16* __restrict__ out,
                                            const int32_t* __restrict__ tokens,
                                            const float* __restrict__ slot, int64_t lo,
                                            int64_t hi, int64_t N, int d) {
  ForEachRowGroup<VEC>(N, d, [&](int64_t n, int64_t c) {
    const int64_t e = int64_t{tokens[n]} * d + c;
    float v[VEC];
    if constexpr (VEC == 8) {
      // lo, hi and e are multiples of 8 here (EmbeddingRowsFromSlot): all in or all out.
      if (e >= lo && e < hi) {
        const float4 a = reinterpret_cast<const float4*>(slot + (e - lo))[0];
        const float4 b = reinterpret_cast<const float4*>(slot + (e - lo))[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = -0.0f;
      }
      StoreVec<8>(out + n * d + c, v);
    } else {
      out[n * d + c] = __float2bfloat16_rn(e >= lo && e < hi ? slot[e - lo] : -0.0f);
    }
  });
}

// EmbeddingBackwardKernel's walk over the rows of N = ranks x rows_per_rank tokens (rank-major),
// into one rank's slot of the gradient (elements [lo, hi) at slot[e - lo]): each rank's rows
// of a token summed in position order from zero, those sums added in rank order from zero, and
// that total added to the slot. Each element thus sees the additions of every rank's own
// backward into a zeroed gradient, then of their sum, then of accumulating it.
template <int VEC>
__global__ void EmbeddingBackwardSlotKernel(float* __restrict__ slot, int64_t lo, int64_t hi,
                                            const bf16* __restrict__ dout,
                                            const uint32_t* __restrict__ sorted_tok,
                                            const int32_t* __restrict__ sorted_pos, int N,
                                            int rows_per_rank, int d, int vocab) {
  int i = 0;
  uint32_t tok = 0;
  int64_t col = 0;
  if (!RunStart<VEC>(sorted_tok, N, d, vocab, &i, &tok, &col)) return;
  const int64_t e = int64_t{tok} * d + col;
  if (e + VEC <= lo || e >= hi) return;  // none of these columns in the slot
  float total[VEC], part[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) total[k] = part[k] = 0.0f;
  int rank = sorted_pos[i] / rows_per_rank;
  for (int j = i;; j += kRunUnroll) {
    float rows[kRunUnroll][VEC];
    bool have[kRunUnroll];
    int owner[kRunUnroll];
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) {
      const int jj = j + u;
      have[u] = jj < N && sorted_tok[jj] == tok;
      owner[u] = have[u] ? sorted_pos[jj] / rows_per_rank : rank;
      if (have[u]) LoadVec<VEC>(dout + int64_t{sorted_pos[jj]} * d + col, rows[u]);
    }
#pragma unroll
    for (int u = 0; u < kRunUnroll; ++u) {
      if (!have[u]) continue;
      if (owner[u] != rank) {  // the sort is stable: a rank's rows come together, in order
#pragma unroll
        for (int k = 0; k < VEC; ++k) total[k] += part[k], part[k] = 0.0f;
        rank = owner[u];
      }
#pragma unroll
      for (int k = 0; k < VEC; ++k) part[k] += rows[u][k];
    }
    if (!have[kRunUnroll - 1]) break;
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    total[k] += part[k];
    if (e + k >= lo && e + k < hi) slot[e + k - lo] += total[k];
  }
}

// Bits needed for keys in [0, vocab] (vocab itself marks an out-of-range token).
int EndBit(int vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

size_t AlignUp(size_t x) { return (x + 255) / 256 * 256; }

// Layout of the backward workspace: keys and positions before and after the sort, cub temp.
struct BackwardLayout {
  size_t keys_in = 0, keys_out = 0, vals_in = 0, vals_out = 0, temp = 0, temp_bytes = 0,
         total = 0;
};

BackwardLayout Layout(int64_t N, int vocab) {
  BackwardLayout l;
  const size_t words = AlignUp(size_t(N) * 4);
  l.keys_in = 0;
  l.keys_out = l.keys_in + words;
  l.vals_in = l.keys_out + words;
  l.vals_out = l.vals_in + words;
  l.temp = l.vals_out + words;
  // Size query only (null temp pointer): no device work, no synchronisation.
  size_t temp_bytes = 0;
  cudaError_t e = cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), static_cast<int>(N),
      0, EndBit(vocab));
  l.temp_bytes = e == cudaSuccess ? temp_bytes : 0;
  l.total = l.temp + AlignUp(l.temp_bytes);
  return l;
}

}  // namespace

Status EmbeddingForward(bf16* out, const int32_t* tokens, const bf16* wte, int64_t N, int d,
                        cudaStream_t stream) {
  if (N < 0 || d <= 0) return Status::Invalid("EmbeddingForward: bad shape N=" +
                                              std::to_string(N) + " d=" + std::to_string(d));
  if (N == 0) return Status::Ok();
  const bool vec = d % 8 == 0 && IsAligned(out, 16) && IsAligned(wte, 16);
  const int64_t items = vec ? N * (d / 8) : N * d;
  const int blocks = static_cast<int>(std::min<int64_t>(CeilDiv(items, kThreads), 65536));
  if (vec) {
    EmbeddingForwardKernel<8><<<blocks, kThreads, 0, stream>>>(out, tokens, wte, N, d);
  } else {
    EmbeddingForwardKernel<1><<<blocks, kThreads, 0, stream>>>(out, tokens, wte, N, d);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

size_t EmbeddingBackwardWorkspace(int64_t N, int vocab) {
  if (N <= 0 || N > INT_MAX || vocab <= 0) return 0;
  return Layout(N, vocab).total;
}

namespace {

// Positions 0..N-1 stably sorted by token into the workspace (see the file comment); the
// sorted tokens and positions come back in *keys and *positions.
Status SortByToken(const int32_t* tokens, int64_t N, int vocab, void* workspace,
                   size_t workspace_bytes, const char* what, const uint32_t** keys,
                   const int32_t** positions, cudaStream_t stream) {
  const BackwardLayout l = Layout(N, vocab);
  if (l.temp_bytes == 0) return Status::Internal(std::string(what) + ": cub size query failed");
  // Sub-buffers sit at 256-byte multiples from the base; cub aligns its own part.
  if (workspace == nullptr || workspace_bytes < l.total || !IsAligned(workspace, 16)) {
    return Status::Invalid(std::string(what) + ": workspace needs " + std::to_string(l.total) +
                           " bytes, 16-byte aligned; got " + std::to_string(workspace_bytes));
  }
  char* ws = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(ws + l.keys_in);
  auto* keys_out = reinterpret_cast<uint32_t*>(ws + l.keys_out);
  auto* vals_in = reinterpret_cast<int32_t*>(ws + l.vals_in);
  auto* vals_out = reinterpret_cast<int32_t*>(ws + l.vals_out);
  const int n = static_cast<int>(N);
  PrepareSortKernel<<<static_cast<int>(std::min<int64_t>(CeilDiv(N, kThreads), 4096)),
                      kThreads, 0, stream>>>(keys_in, vals_in, tokens, n, vocab);
  FORGE_CUDA_LAUNCH_CHECK();
  size_t temp_bytes = l.temp_bytes;
  FORGE_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(ws + l.temp, temp_bytes, keys_in, keys_out,
                                                   vals_in, vals_out, n, 0, EndBit(vocab),
                                                   stream));
  *keys = keys_out;
  *positions = vals_out;
  return Status::Ok();
}

Status CheckBackwardShape(const char* what, int64_t N, int d, int vocab) {
  if (N < 0 || N > INT_MAX || d <= 0 || vocab <= 0) {
    return Status::Invalid(std::string(what) + ": bad shape N=" + std::to_string(N) +
                           " d=" + std::to_string(d) + " vocab=" + std::to_string(vocab));
  }
  return Status::Ok();
}

template <typename T>
Status LaunchEmbeddingBackward(T* dwte, const bf16* dout, const int32_t* tokens, int64_t N, int d,
                               int vocab, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckBackwardShape("EmbeddingBackward", N, d, vocab));
  if (N == 0) return Status::Ok();
  const uint32_t* keys = nullptr;
  const int32_t* positions = nullptr;
  FORGE_RETURN_IF_ERROR(SortByToken(tokens, N, vocab, workspace, workspace_bytes,
                                    "EmbeddingBackward", &keys, &positions, stream));
  const int n = static_cast<int>(N);
  const bool vec = d % 8 == 0 && IsAligned(dout, 16) && IsAligned(dwte, 16);
  const int vec_width = vec ? 8 : 1;
  const dim3 grid(static_cast<unsigned>(CeilDiv(N, kWarpsPerBlock)),
                  static_cast<unsigned>(CeilDiv(d, 32 * vec_width)));
  if (grid.y > 65535) return Status::Invalid("EmbeddingBackward: d too large");
  if (vec) {
    EmbeddingBackwardKernel<8, T>
        <<<grid, kThreads, 0, stream>>>(dwte, dout, keys, positions, n, d, vocab);
  } else {
    EmbeddingBackwardKernel<1, T>
        <<<grid, kThreads, 0, stream>>>(dwte, dout, keys, positions, n, d, vocab);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace

Status EmbeddingBackward(float* dwte, const bf16* dout, const int32_t* tokens, int64_t N, int d,
                         int vocab, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return LaunchEmbeddingBackward(dwte, dout, tokens, N, d, vocab, workspace, workspace_bytes,
                                 stream);
}

Status EmbeddingBackward(bf16* dwte, const bf16* dout, const int32_t* tokens, int64_t N, int d,
                         int vocab, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return LaunchEmbeddingBackward(dwte, dout, tokens, N, d, vocab, workspace, workspace_bytes,
                                 stream);
}

Status EmbeddingRowsFromSlot(bf16* out, const int32_t* tokens, int64_t N, int d,
                             const float* slot, int64_t lo, int64_t hi, cudaStream_t stream) {
  if (N < 0 || d <= 0 || lo < 0 || hi < lo) {
    return Status::Invalid("EmbeddingRowsFromSlot: bad shape N=" + std::to_string(N) +
                           " d=" + std::to_string(d) + " slot [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + ")");
  }
  if (N == 0) return Status::Ok();
  // Eight at a time where a vector of 8 columns is wholly inside or outside the slot.
  const bool vec = d % 8 == 0 && lo % 8 == 0 && hi % 8 == 0 && IsAligned(out, 16) &&
                   IsAligned(slot, 16);
  const int64_t items = vec ? N * (d / 8) : N * d;
  const int blocks = static_cast<int>(std::min<int64_t>(CeilDiv(items, kThreads), 65536));
  if (vec) {
    EmbeddingRowsFromSlotKernel<8>
        <<<blocks, kThreads, 0, stream>>>(out, tokens, slot, lo, hi, N, d);
  } else {
    EmbeddingRowsFromSlotKernel<1>
        <<<blocks, kThreads, 0, stream>>>(out, tokens, slot, lo, hi, N, d);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

Status EmbeddingBackwardToSlot(float* slot, int64_t lo, int64_t hi, const bf16* dout,
                               const int32_t* tokens, int64_t N, int64_t rows_per_rank, int d,
                               int vocab, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  FORGE_RETURN_IF_ERROR(CheckBackwardShape("EmbeddingBackwardToSlot", N, d, vocab));
  if (lo < 0 || hi < lo || rows_per_rank <= 0 || N % rows_per_rank != 0) {
    return Status::Invalid("EmbeddingBackwardToSlot: slot [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + ") or rows a rank " +
                           std::to_string(rows_per_rank) + " of " + std::to_string(N));
  }
  if (N == 0 || hi == lo) return Status::Ok();
  const uint32_t* keys = nullptr;
  const int32_t* positions = nullptr;
  FORGE_RETURN_IF_ERROR(SortByToken(tokens, N, vocab, workspace, workspace_bytes,
                                    "EmbeddingBackwardToSlot", &keys, &positions, stream));
  const int n = static_cast<int>(N), per = static_cast<int>(rows_per_rank);
  const bool vec = d % 8 == 0 && IsAligned(dout, 16);
  const int vec_width = vec ? 8 : 1;
  const dim3 grid(static_cast<unsigned>(CeilDiv(N, kWarpsPerBlock)),
                  static_cast<unsigned>(CeilDiv(d, 32 * vec_width)));
  if (grid.y > 65535) return Status::Invalid("EmbeddingBackwardToSlot: d too large");
  if (vec) {
    EmbeddingBackwardSlotKernel<8>
        <<<grid, kThreads, 0, stream>>>(slot, lo, hi, dout, keys, positions, n, per, d, vocab);
  } else {
    EmbeddingBackwardSlotKernel<1>
        <<<grid, kThreads, 0, stream>>>(slot, lo, hi, dout, keys, positions, n, per, d, vocab);
  }
  FORGE_CUDA_LAUNCH_CHECK();
  return Status::Ok();
}

}  // namespace forge::cuda
