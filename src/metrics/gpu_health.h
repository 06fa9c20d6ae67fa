// GPU health gauges (utilisation, memory, power, temperature, SM clock, throttle reasons) read
// from NVML at scrape time: a prometheus-cpp Collectable, so nothing polls between scrapes.
// Where NVML cannot be loaded (CPU machines) Make() returns null and the process exports no
// GPU series at all, rather than zeros that would look like an idle GPU.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metrics/nvml_loader.h"

namespace forge {

// The NVML index of the GPU a rank trains on, from the NVML indices of the devices the process
// sees (Nvml::VisibleDevices, in CUDA ordinal order): the one TrainingDeviceOrdinal picks. None
// when nothing is visible.
std::optional<unsigned> TrainingGpu(const std::vector<unsigned>& visible, int local_rank, int world);

// The product name ("NVIDIA H100 80GB HBM3") of the GPU that CUDA numbers `ordinal` in this
// process (CUDA_VISIBLE_DEVICES applied, as TrainingGpu reads it; an ordinal past the visible
// devices wraps, as ranks are placed under srun --gpus-per-task=1); "" where NVML cannot be
// loaded or sees no visible device. A worker reports it to the coordinator, which
// takes the rank's MFU peak from it.
std::string GpuProductName(int ordinal, const std::string& library = "libnvidia-ml.so.1");

class GpuHealthCollector : public prometheus::Collectable {
 public:
  // The GPU this rank trains on (TrainingGpu of CUDA_VISIBLE_DEVICES, all devices when unset),
  // labelled with run_id, rank and its NVML index (gpu): each rank exports its own GPU only,
  // so the ranks of a node never report one GPU twice. Null, with the reason in *why (if
  // given), when NVML is unavailable or sees no device.
  static std::shared_ptr<GpuHealthCollector> Make(const std::string& run_id, int rank,
                                                  int local_rank, int world,
                                                  std::string* why = nullptr,
                                                  const std::string& library = "libnvidia-ml.so.1");
  GpuHealthCollector(std::unique_ptr<Nvml> nvml, unsigned device, std::string run_id, int rank);

  std::vector<prometheus::MetricFamily> Collect() const override;
  const Nvml& nvml() const { return *nvml_; }
  unsigned device() const { return device_; }  // NVML index

 private:
  std::unique_ptr<Nvml> nvml_;
  unsigned device_;
  std::string run_id_;
  int rank_;
};

// The families GpuHealthCollector::Collect() builds for these samples (exposed for tests).
std::vector<prometheus::MetricFamily> GpuHealthFamilies(const std::vector<GpuHealthSample>& samples,
                                                        const std::string& run_id, int rank);

}  // namespace forge
