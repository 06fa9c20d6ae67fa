// Kernel launches with programmatic dependent launch (PDL, Hopper's griddepcontrol).
//
// Why: in a step of ~700 mostly dependent kernels, each boundary costs the next grid's launch
// (front-end work, block dispatch, the prologue) after the previous grid has fully drained. A
// grid launched through LaunchPdl may be dispatched while its predecessor in the stream is
// still finishing its last wave; its blocks then park in PdlWaitPrior() until that grid has
// completed and its writes are visible. So the order of work is unchanged, only the launch
// overlaps.
//
// The contract, for every kernel launched through LaunchPdl: call PdlWaitPrior() before the
// first read or write of memory that earlier work in the stream touches (in practice: first
// thing, after any setup that uses only kernel parameters and shared memory), and
// PdlReleaseNext() after it, so the next grid can be dispatched as soon as every block of this
// one is running. Both are no-ops when the grid was launched without PDL (FORGE_CUDA_PDL=0, or
// a predecessor that is not a kernel: memcpy, event wait), and on pre-Hopper devices.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace forge::cuda {

// FORGE_CUDA_PDL: "0" launches every kernel the ordinary way (read once per process).
bool PdlEnabled();
// For tests and benchmarks that compare both ways in one process.
void SetPdlEnabled(bool on);

template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = PdlEnabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

__device__ __forceinline__ void PdlWaitPrior() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlReleaseNext() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The usual pair at the top of a kernel with no parameter-only setup.
__device__ __forceinline__ void PdlEnter() {
  PdlWaitPrior();
  PdlReleaseNext();
}

}  // namespace forge::cuda
