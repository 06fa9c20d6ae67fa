#include "metrics/nvml_loader.h"

#include <dlfcn.h>

#include <charconv>
#include <cstring>
#include <string_view>
#include <type_traits>

// The NVML API v2 types. From the CUDA toolkit's header when the build found one (cmake adds
// its include dir); otherwise this private declaration of the same subset, which is NVML's
// stable C ABI (handles are opaque pointers, return codes ints, the two structs unchanged
// since NVML 2). Only types are used: every function is reached through dlsym.
#if __has_include(<nvml.h>)
#define NVML_NO_UNVERSIONED_FUNC_DEFS  // names below are the exported symbols, not macro aliases
#include <nvml.h>
#define FORGE_NVML_FROM_TOOLKIT 1
#else
extern "C" {
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef enum nvmlReturn_enum { NVML_SUCCESS = 0, NVML_ERROR_NOT_SUPPORTED = 3 } nvmlReturn_t;
typedef enum nvmlTemperatureSensors_enum { NVML_TEMPERATURE_GPU = 0 } nvmlTemperatureSensors_t;
typedef enum nvmlClockType_enum { NVML_CLOCK_SM = 1 } nvmlClockType_t;
typedef struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;
typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;
}
#endif

namespace forge {

// Entry points, typed like nvml.h's declarations.
struct Nvml::Api {
  nvmlReturn_t (*init)(void);
  nvmlReturn_t (*shutdown)(void);
  const char* (*error_string)(nvmlReturn_t);
  nvmlReturn_t (*device_count)(unsigned int*);
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
  // Optional (null when the library lacks them; the sample field stays empty): deprecated
  // entry points a future driver may drop.
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*);  // milliwatts
  nvmlReturn_t (*temperature)(nvmlDevice_t, nvmlTemperatureSensors_t, unsigned int*);
  nvmlReturn_t (*clock)(nvmlDevice_t, nvmlClockType_t, unsigned int*);  // MHz
  nvmlReturn_t (*throttle)(nvmlDevice_t, unsigned long long*);
};

#ifdef FORGE_NVML_FROM_TOOLKIT
// The header and our table must agree.
static_assert(std::is_same_v<decltype(&nvmlInit_v2), decltype(Nvml::Api::init)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetCount_v2), decltype(Nvml::Api::device_count)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetHandleByIndex_v2),
                             decltype(Nvml::Api::handle_by_index)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetMemoryInfo), decltype(Nvml::Api::memory)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetUtilizationRates),
                             decltype(Nvml::Api::utilization)>);
static_assert(std::is_same_v<decltype(&nvmlDeviceGetClockInfo), decltype(Nvml::Api::clock)>);
#endif

const std::vector<ThrottleReason>& ThrottleReasons() {
  // Bits as nvml.h defines nvmlClocksThrottleReason* (checked against it where it exists).
  static const std::vector<ThrottleReason> kReasons = {
      {0x1, "gpu_idle"},
      {0x2, "applications_clocks_setting"},
      {0x4, "sw_power_cap"},
      {0x8, "hw_slowdown"},
      {0x10, "sync_boost"},
      {0x20, "sw_thermal_slowdown"},
      {0x40, "hw_thermal_slowdown"},
      {0x80, "hw_power_brake_slowdown"},
      {0x100, "display_clock_setting"},
  };
#ifdef nvmlClocksThrottleReasonGpuIdle  // deprecated names; newer headers may drop them
  static_assert(nvmlClocksThrottleReasonGpuIdle == 0x1);
  static_assert(nvmlClocksThrottleReasonSwPowerCap == 0x4);
  static_assert(nvmlClocksThrottleReasonHwSlowdown == 0x8);
  static_assert(nvmlClocksThrottleReasonSwThermalSlowdown == 0x20);
  static_assert(nvmlClocksThrottleReasonHwThermalSlowdown == 0x40);
  static_assert(nvmlClocksThrottleReasonHwPowerBrakeSlowdown == 0x80);
#endif
  return kReasons;
}

namespace {

template <typename Fn>
bool Resolve(void* handle, const char* symbol, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, symbol));
  return *out != nullptr;
}

}  // namespace

StatusOr<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library) {
  dlerror();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return Status::Unavailable("NVML not available: " + std::string(why ? why : library));
  }
  auto api = std::make_unique<Api>();
  const char* missing = nullptr;
  auto need = [&](const char* symbol, auto* fn) {
    if (missing == nullptr && !Resolve(handle, symbol, fn)) missing = symbol;
  };
  need("nvmlInit_v2", &api->init);
  need("nvmlShutdown", &api->shutdown);
  need("nvmlErrorString", &api->error_string);
  need("nvmlDeviceGetCount_v2", &api->device_count);
  need("nvmlDeviceGetHandleByIndex_v2", &api->handle_by_index);
  need("nvmlDeviceGetName", &api->name);
  need("nvmlDeviceGetUUID", &api->uuid);
  need("nvmlDeviceGetMemoryInfo", &api->memory);
  if (missing != nullptr) {
    dlclose(handle);
    return Status::Unavailable("NVML not available: " + library + " lacks " + missing);
  }
  Resolve(handle, "nvmlDeviceGetUtilizationRates", &api->utilization);
  Resolve(handle, "nvmlDeviceGetPowerUsage", &api->power);
  Resolve(handle, "nvmlDeviceGetTemperature", &api->temperature);
  Resolve(handle, "nvmlDeviceGetClockInfo", &api->clock);
  // Renamed in CUDA 12.2's NVML ("clocks event reasons"); older drivers have only the old name.
  if (!Resolve(handle, "nvmlDeviceGetCurrentClocksEventReasons", &api->throttle))
    Resolve(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", &api->throttle);

  const nvmlReturn_t rc = api->init();
  if (rc != NVML_SUCCESS) {
    const std::string why = api->error_string(rc);
    dlclose(handle);
    return Status::Unavailable("NVML not available: nvmlInit: " + why);
  }
  std::unique_ptr<Nvml> nvml(new Nvml());
  nvml->handle_ = handle;
  nvml->api_ = std::move(api);
  unsigned count = 0;
  if (nvml->api_->device_count(&count) == NVML_SUCCESS) nvml->count_ = count;
  return nvml;
}

Nvml::~Nvml() {
  if (api_) api_->shutdown();
  if (handle_) dlclose(handle_);
}

namespace {

Status NvmlError(const char* (*error_string)(nvmlReturn_t), const char* what, unsigned index,
                 nvmlReturn_t rc) {
  return Status::Unavailable(std::string(what) + " of GPU " + std::to_string(index) + ": " +
                             error_string(rc));
}

// One of NVML's per-device strings: `get` is nvmlDeviceGetName or nvmlDeviceGetUUID, `what`
// names it in the error.
StatusOr<std::string> DeviceString(const Nvml::Api& api, unsigned index,
                                   nvmlReturn_t (*get)(nvmlDevice_t, char*, unsigned int),
                                   const char* what) {
  nvmlDevice_t dev;
  nvmlReturn_t rc = api.handle_by_index(index, &dev);
  if (rc != NVML_SUCCESS) return NvmlError(api.error_string, "handle", index, rc);
  char buf[96] = {};
  rc = get(dev, buf, sizeof buf);
  if (rc != NVML_SUCCESS) return NvmlError(api.error_string, what, index, rc);
  return std::string(buf);
}

}  // namespace

StatusOr<std::string> Nvml::DeviceName(unsigned index) const {
  return DeviceString(*api_, index, api_->name, "name");
}

StatusOr<std::string> Nvml::DeviceUuid(unsigned index) const {
  return DeviceString(*api_, index, api_->uuid, "uuid");
}

StatusOr<GpuHealthSample> Nvml::Sample(unsigned index) const {
  nvmlDevice_t dev;
  const nvmlReturn_t rc = api_->handle_by_index(index, &dev);
  if (rc != NVML_SUCCESS) return NvmlError(api_->error_string, "handle", index, rc);
  GpuHealthSample s;
  s.index = index;
  char buf[96] = {};
  if (api_->name(dev, buf, sizeof buf) == NVML_SUCCESS) s.name = buf;
  std::memset(buf, 0, sizeof buf);
  if (api_->uuid(dev, buf, sizeof buf) == NVML_SUCCESS) s.uuid = buf;
  nvmlUtilization_t util;
  if (api_->utilization && api_->utilization(dev, &util) == NVML_SUCCESS) s.utilization = util.gpu / 100.0;
  nvmlMemory_t mem;
  if (api_->memory(dev, &mem) == NVML_SUCCESS) {
    s.memory_used = mem.used;
    s.memory_total = mem.total;
  }
  unsigned v = 0;
  if (api_->power && api_->power(dev, &v) == NVML_SUCCESS) s.power_watts = v / 1000.0;
  if (api_->temperature && api_->temperature(dev, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS) s.temperature_c = v;
  if (api_->clock && api_->clock(dev, NVML_CLOCK_SM, &v) == NVML_SUCCESS) s.sm_clock_hz = v * 1e6;
  unsigned long long reasons = 0;
  if (api_->throttle && api_->throttle(dev, &reasons) == NVML_SUCCESS) s.throttle_reasons = reasons;
  return s;
}

std::vector<unsigned> Nvml::VisibleDevices(const char* cuda_visible_devices) const {
  std::vector<unsigned> out;
  if (cuda_visible_devices == nullptr) {
    for (unsigned i = 0; i < count_; ++i) out.push_back(i);
    return out;
  }
  std::string_view list(cuda_visible_devices);
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view entry = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
    while (!entry.empty() && entry.back() == ' ') entry.remove_suffix(1);
    std::optional<unsigned> found;
    if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string_view::npos) {
      unsigned i = 0;
      const auto [end, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), i);
      if (ec == std::errc() && end == entry.data() + entry.size() && i < count_) found = i;
    } else if (!entry.empty()) {
      for (unsigned i = 0; i < count_ && !found; ++i) {
        auto uuid = DeviceUuid(i);
        if (uuid.ok() && uuid->compare(0, entry.size(), entry) == 0) found = i;
      }
    }
    if (!found) break;  // CUDA ignores everything from the first invalid entry on
    out.push_back(*found);
  }
  return out;
}

}  // namespace forge
