#include "kernels/cuda/tma_map.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tile_order.h"

namespace forge::cuda {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

Status EncodeTiledFunction(EncodeTiledFn* fn) {
  static EncodeTiledFn cached = nullptr;
  if (!cached) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    FORGE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                      cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p)
      return Status::Internal("cuTensorMapEncodeTiled: not found in the driver");
    cached = reinterpret_cast<EncodeTiledFn>(p);
  }
  *fn = cached;
  return Status::Ok();
}

}  // namespace

Status SwizzledMap(const void* base, int64_t rows, int64_t cols, int box_rows, CUtensorMap* map,
                   int elem_bytes, int row_bytes) {
  if (row_bytes != 128 && row_bytes != 64)
    return Status::Internal("SwizzledMap: rows of 128 or 64 bytes, not " +
                            std::to_string(row_bytes));
  EncodeTiledFn encode = nullptr;
  FORGE_RETURN_IF_ERROR(EncodeTiledFunction(&encode));
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * elem_bytes};
  const cuuint32_t box[2] = {cuuint32_t(row_bytes / elem_bytes), cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUtensorMapDataType type =
      elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r =
      encode(map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE,
             row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return Status::Internal("cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) +
                            ") for a " + std::to_string(rows) + "x" + std::to_string(cols) +
                            " operand");
  return Status::Ok();
}

Status CheckLaunchRegisters(const void* kernel, int launch, const std::string& name) {
  static std::mutex mu;
  static std::map<const void*, int> known;
  int regs = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(kernel); it != known.end()) {
      regs = it->second;
    } else {
      cudaFuncAttributes attr{};
      FORGE_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
      regs = known[kernel] = attr.numRegs;
    }
  }
  if (regs != launch)
    return Status::Internal(name + ": built with " + std::to_string(regs) +
                            " registers a thread; its setmaxnreg split assumes " +
                            std::to_string(launch));
  return Status::Ok();
}

Status CheckSm90(const std::string& name) {
  int dev = 0, major = 0, minor = 0;
  FORGE_CUDA_CHECK(cudaGetDevice(&dev));
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    return Status::Invalid(name + ": needs an sm_90 GPU (Hopper), this is sm_" +
                           std::to_string(major * 10 + minor));
  return Status::Ok();
}

StatusOr<int> DeviceSmCount() {
  int dev = 0, sms = 0;
  FORGE_CUDA_CHECK(cudaGetDevice(&dev));
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

StatusOr<int> LaunchGroupRows(int asked, int64_t b_bytes) {
  if (asked > 0) return asked;
  int dev = 0, l2 = 0;
  FORGE_CUDA_CHECK(cudaGetDevice(&dev));
  FORGE_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  return TileGroupRows(b_bytes, l2);
}

}  // namespace forge::cuda
