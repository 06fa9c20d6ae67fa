// GPU health gauges (utilisation, memory, power, temperature, SM clock, throttle reasons) read
// from NVML at scrape time: a prometheus-cpp Collectable, so nothing polls between scrapes.
// Where NVML cannot be loaded (CPU machines) Make() returns null and the process exports no
// GPU series at all, rather than zeros that would look like an idle GPU.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <memory>
#include <string>
#include <vector>

#include "metrics/nvml_loader.h"

namespace forge {

class GpuHealthCollector : public prometheus::Collectable {
 public:
  // The devices in CUDA_VISIBLE_DEVICES (all when unset), labelled with run_id and rank.
  // Null, with the reason in *why (if given), when NVML is unavailable or sees no device.
  static std::shared_ptr<GpuHealthCollector> Make(const std::string& run_id, int rank,
                                                  std::string* why = nullptr,
                                                  const std::string& library = "libnvidia-ml.so.1");
  GpuHealthCollector(std::unique_ptr<Nvml> nvml, std::vector<unsigned> devices,
                     std::string run_id, int rank);

  std::vector<prometheus::MetricFamily> Collect() const override;
  const Nvml& nvml() const { return *nvml_; }
  const std::vector<unsigned>& devices() const { return devices_; }

 private:
  std::unique_ptr<Nvml> nvml_;
  std::vector<unsigned> devices_;
  std::string run_id_;
  int rank_;
};

// The families GpuHealthCollector::Collect() builds for these samples (exposed for tests).
std::vector<prometheus::MetricFamily> GpuHealthFamilies(const std::vector<GpuHealthSample>& samples,
                                                        const std::string& run_id, int rank);

}  // namespace forge
