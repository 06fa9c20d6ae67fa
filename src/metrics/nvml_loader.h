// NVML (libnvidia-ml), loaded at run time with dlopen: Forge links nothing of it, so the same
// binary runs on machines without an NVIDIA driver, where Load() simply fails (Unavailable)
// and no GPU health is exported. The function types come from the CUDA toolkit's nvml.h
// where it is installed (a private fallback declares the same subset otherwise; see the .cc).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace forge {

// NVML's clock throttle reason bits ("clocks event reasons" in newer drivers), with the label
// value forge_gpu_throttle_reason uses for each.
struct ThrottleReason {
  uint64_t bit;
  const char* label;
};
const std::vector<ThrottleReason>& ThrottleReasons();

// One device's health; a field NVML does not support on that device stays empty.
struct GpuHealthSample {
  unsigned index = 0;  // NVML index (not the CUDA ordinal)
  std::string name, uuid;
  std::optional<double> utilization;          // 0..1
  std::optional<uint64_t> memory_used, memory_total;  // bytes
  std::optional<double> power_watts;
  std::optional<double> temperature_c;
  std::optional<double> sm_clock_hz;
  std::optional<uint64_t> throttle_reasons;   // bit mask of ThrottleReasons()
};

class Nvml {
 public:
  // dlopen(library) + nvmlInit. Unavailable (with the reason: no such library, a missing
  // symbol, nvmlInit's error) when NVML cannot be used; nothing is left loaded then.
  static StatusOr<std::unique_ptr<Nvml>> Load(const std::string& library = "libnvidia-ml.so.1");
  ~Nvml();  // nvmlShutdown + dlclose

  unsigned device_count() const { return count_; }
  StatusOr<std::string> DeviceName(unsigned index) const;
  StatusOr<std::string> DeviceUuid(unsigned index) const;
  StatusOr<GpuHealthSample> Sample(unsigned index) const;

  // The NVML indices of the devices this process may use: CUDA_VISIBLE_DEVICES read as
  // ordinals or GPU UUIDs (prefixes allowed, as CUDA does), every device when it is unset.
  // Entries that match nothing end the list, as they end CUDA's.
  std::vector<unsigned> VisibleDevices(const char* cuda_visible_devices) const;

  struct Api;  // the resolved entry points (nvml_loader.cc)

 private:
  Nvml() = default;
  void* handle_ = nullptr;
  std::unique_ptr<Api> api_;
  unsigned count_ = 0;
};

}  // namespace forge
