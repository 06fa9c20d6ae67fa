// A stand-in libnvidia-ml for the GPU health tests on machines without an NVIDIA driver (this
// one and CI): the subset Nvml::Load requires, over $FORGE_FAKE_NVML_DEVICES devices (default
// 4). Device i is "NVIDIA H100 80GB HBM3" ($FORGE_FAKE_NVML_NAME when set) with UUID
// GPU-00000000-0000-0000-0000-00000000000<i> and i GiB of its 80 GiB used, so a test can tell
// from a sample which device it came from.
// The optional entry points (utilisation, power, ...) are left out, as an old driver might.
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef int nvmlReturn_t;  // NVML_SUCCESS 0, NVML_ERROR_INVALID_ARGUMENT 2
struct nvmlMemory_t {
  unsigned long long total, free, used;
};

namespace {
constexpr nvmlReturn_t kSuccess = 0, kInvalidArgument = 2;

unsigned Count() {
  const char* n = std::getenv("FORGE_FAKE_NVML_DEVICES");
  return n != nullptr ? unsigned(std::atoi(n)) : 4u;
}

// Handles are index + 1 (never null).
long Index(nvmlDevice_t d) { return reinterpret_cast<long>(d) - 1; }
}  // namespace

nvmlReturn_t nvmlInit_v2(void) { return kSuccess; }
nvmlReturn_t nvmlShutdown(void) { return kSuccess; }
const char* nvmlErrorString(nvmlReturn_t rc) { return rc == kSuccess ? "Success" : "Invalid Argument"; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = Count();
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (index >= Count()) return kInvalidArgument;
  *device = reinterpret_cast<nvmlDevice_t>(long(index) + 1);
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t, char* name, unsigned int length) {
  const char* given = std::getenv("FORGE_FAKE_NVML_NAME");
  std::snprintf(name, length, "%s", given != nullptr ? given : "NVIDIA H100 80GB HBM3");
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char* uuid, unsigned int length) {
  std::snprintf(uuid, length, "GPU-00000000-0000-0000-0000-%012ld", Index(d));
  return kSuccess;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* memory) {
  memory->total = 80ull << 30;
  memory->used = (unsigned long long)Index(d) << 30;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

}  // extern "C"
