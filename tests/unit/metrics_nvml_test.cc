// NVML loaded at run time: without the library (every CPU machine, this one included) loading
// fails with a reason and no GPU series are exported; with a library that is not NVML the
// loader names the missing symbol. The gauges built from a sample are checked on their own.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include "metrics/gpu_health.h"
#include "metrics/metric_catalog.h"
#include "metrics/nvml_loader.h"

namespace forge {
namespace {

bool SystemHasNvml() {
  void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != nullptr;
}

TEST(Nvml, AbsentLibraryIsUnavailableWithTheReason) {
  auto n = Nvml::Load("libnvidia-ml-not-here.so.1");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kUnavailable);
  EXPECT_NE(n.status().message().find("libnvidia-ml-not-here.so.1"), std::string::npos)
      << n.status().message();
}

TEST(Nvml, ALibraryThatIsNotNvmlNamesTheMissingSymbol) {
  auto n = Nvml::Load("libz.so.1");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kUnavailable);
  EXPECT_NE(n.status().message().find("lacks nvmlInit_v2"), std::string::npos)
      << n.status().message();
}

TEST(Nvml, NoLibraryNoCollector) {
  std::string why;
  EXPECT_EQ(GpuHealthCollector::Make("r", 0, 0, 1, &why, "libnvidia-ml-not-here.so.1"), nullptr);
  EXPECT_NE(why.find("NVML not available"), std::string::npos) << why;
  if (!SystemHasNvml()) {  // the default library name on a machine without a driver
    why.clear();
    EXPECT_EQ(GpuHealthCollector::Make("r", 0, 0, 1, &why), nullptr);
    EXPECT_FALSE(why.empty());
  }
}

TEST(GpuHealth, SampleBecomesCatalogGauges) {
  GpuHealthSample s;
  s.index = 3;
  s.name = "NVIDIA H100 80GB HBM3";
  s.uuid = "GPU-1234";
  s.utilization = 0.97;
  s.memory_used = 70ull << 30;
  s.memory_total = 80ull << 30;
  s.power_watts = 650.5;
  s.temperature_c = 71;
  s.sm_clock_hz = 1.98e9;
  s.throttle_reasons = 0x4 | 0x40;  // sw power cap + hw thermal
  GpuHealthSample unsupported;       // a device where NVML supports nothing but name
  unsupported.index = 4;
  const auto families = GpuHealthFamilies({s, unsupported}, "run-a", 2);
  std::map<std::string, const prometheus::MetricFamily*> by_name;
  for (const auto& f : families) {
    ASSERT_NE(FindMetric(f.name), nullptr) << f.name;
    EXPECT_EQ(FindMetric(f.name)->source, MetricSource::kGpuHealth);
    by_name[f.name] = &f;
  }
  ASSERT_TRUE(by_name.count("forge_gpu_utilization_ratio"));
  ASSERT_EQ(by_name["forge_gpu_utilization_ratio"]->metric.size(), 1u);  // not for device 4
  EXPECT_EQ(by_name["forge_gpu_utilization_ratio"]->metric[0].gauge.value, 0.97);
  EXPECT_EQ(by_name["forge_gpu_info"]->metric.size(), 2u);
  EXPECT_EQ(by_name["forge_gpu_power_watts"]->metric[0].gauge.value, 650.5);
  EXPECT_EQ(by_name["forge_gpu_sm_clock_hertz"]->metric[0].gauge.value, 1.98e9);
  int active = 0;
  for (const auto& m : by_name["forge_gpu_throttle_reason"]->metric) {
    std::string reason, gpu, rank;
    for (const auto& l : m.label) {
      if (l.name == "reason") reason = l.value;
      if (l.name == "gpu") gpu = l.value;
      if (l.name == "rank") rank = l.value;
    }
    EXPECT_EQ(gpu, "3");
    EXPECT_EQ(rank, "2");
    const bool want = reason == "sw_power_cap" || reason == "hw_thermal_slowdown";
    EXPECT_EQ(m.gauge.value, want ? 1.0 : 0.0) << reason;
    active += m.gauge.value > 0;
  }
  EXPECT_EQ(active, 2);
  EXPECT_EQ(by_name["forge_gpu_throttle_reason"]->metric.size(), ThrottleReasons().size());
}

}  // namespace
}  // namespace forge
