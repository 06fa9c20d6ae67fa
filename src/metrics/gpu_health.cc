#include "metrics/gpu_health.h"

#include <prometheus/client_metric.h>

#include <cstdlib>
#include <map>

#include "metrics/metric_catalog.h"
#include "worker/train/train_device.h"

namespace forge {
namespace {

prometheus::MetricFamily Family(std::string_view name) {
  const MetricInfo* m = FindMetric(name);
  prometheus::MetricFamily f;
  f.name = std::string(m->name);
  f.help = std::string(m->help);
  f.type = prometheus::MetricType::Gauge;
  return f;
}

prometheus::ClientMetric Gauge(std::vector<prometheus::ClientMetric::Label> labels, double v) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = v;
  return m;
}

}  // namespace

std::vector<prometheus::MetricFamily> GpuHealthFamilies(const std::vector<GpuHealthSample>& samples,
                                                        const std::string& run_id, int rank) {
  std::map<std::string_view, prometheus::MetricFamily> out;
  auto add = [&](std::string_view name, const GpuHealthSample& s,
                 std::vector<prometheus::ClientMetric::Label> extra, double v) {
    auto it = out.find(name);
    if (it == out.end()) it = out.emplace(name, Family(name)).first;
    std::vector<prometheus::ClientMetric::Label> labels = {
        {"run_id", run_id}, {"rank", std::to_string(rank)}, {"gpu", std::to_string(s.index)}};
    for (auto& l : extra) labels.push_back(std::move(l));
    it->second.metric.push_back(Gauge(std::move(labels), v));
  };
  for (const GpuHealthSample& s : samples) {
    add("forge_gpu_info", s, {{"name", s.name}, {"uuid", s.uuid}}, 1.0);
    if (s.utilization) add("forge_gpu_utilization_ratio", s, {}, *s.utilization);
    if (s.memory_used) add("forge_gpu_device_memory_bytes", s, {{"kind", "used"}}, double(*s.memory_used));
    if (s.memory_total)
      add("forge_gpu_device_memory_bytes", s, {{"kind", "total"}}, double(*s.memory_total));
    if (s.power_watts) add("forge_gpu_power_watts", s, {}, *s.power_watts);
    if (s.temperature_c) add("forge_gpu_temperature_celsius", s, {}, *s.temperature_c);
    if (s.sm_clock_hz) add("forge_gpu_sm_clock_hertz", s, {}, *s.sm_clock_hz);
    if (s.throttle_reasons) {
      for (const ThrottleReason& r : ThrottleReasons())
        add("forge_gpu_throttle_reason", s, {{"reason", r.label}},
            (*s.throttle_reasons & r.bit) ? 1.0 : 0.0);
    }
  }
  std::vector<prometheus::MetricFamily> families;
  for (auto& [name, f] : out) families.push_back(std::move(f));
  return families;
}

std::optional<unsigned> TrainingGpu(const std::vector<unsigned>& visible, int local_rank,
                                    int world) {
  if (visible.empty()) return std::nullopt;
  return visible[size_t(TrainingDeviceOrdinal(local_rank, world, int(visible.size())))];
}

std::string GpuProductName(int ordinal, const std::string& library) {
  auto nvml = Nvml::Load(library);
  if (!nvml.ok() || ordinal < 0) return "";
  const std::vector<unsigned> visible =
      (*nvml)->VisibleDevices(std::getenv("CUDA_VISIBLE_DEVICES"));
  if (visible.empty()) return "";
  // Modulo the visible devices, as TrainingDeviceOrdinal places ranks (one GPU per task).
  auto name = (*nvml)->DeviceName(visible[size_t(ordinal) % visible.size()]);
  return name.ok() ? *name : "";
}

std::shared_ptr<GpuHealthCollector> GpuHealthCollector::Make(const std::string& run_id, int rank,
                                                             int local_rank, int world,
                                                             std::string* why,
                                                             const std::string& library) {
  auto nvml = Nvml::Load(library);
  if (!nvml.ok()) {
    if (why) *why = nvml.status().ToString();
    return nullptr;
  }
  const std::optional<unsigned> device = TrainingGpu(
      (*nvml)->VisibleDevices(std::getenv("CUDA_VISIBLE_DEVICES")), local_rank, world);
  if (!device) {
    if (why) *why = "NVML sees no visible GPU";
    return nullptr;
  }
  return std::make_shared<GpuHealthCollector>(std::move(nvml).value(), *device, run_id, rank);
}

GpuHealthCollector::GpuHealthCollector(std::unique_ptr<Nvml> nvml, unsigned device,
                                       std::string run_id, int rank)
    : nvml_(std::move(nvml)), device_(device), run_id_(std::move(run_id)), rank_(rank) {}

std::vector<prometheus::MetricFamily> GpuHealthCollector::Collect() const {
  std::vector<GpuHealthSample> samples;
  auto s = nvml_->Sample(device_);
  if (s.ok()) samples.push_back(std::move(s).value());  // a device that vanished is skipped
  return GpuHealthFamilies(samples, run_id_, rank_);
}

}  // namespace forge
