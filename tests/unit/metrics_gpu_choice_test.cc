// Each rank exports the health of the one GPU it trains on, labelled with its NVML index: the
// device the NCCL group picks (TrainingDeviceOrdinal) among those CUDA_VISIBLE_DEVICES shows,
// so the ranks of a node never report one GPU twice. The collector runs over a stand-in
// libnvidia-ml (tests/fake_nvml: 4 devices, device i has i GiB used) since no driver is here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include "metrics/gpu_health.h"
#include "worker/train/train_device.h"

namespace forge {
namespace {

TEST(TrainingDevice, LocalRankModuloVisibleWhenDataParallelElseDeviceZero) {
  EXPECT_EQ(TrainingDeviceOrdinal(0, 4, 4), 0);
  EXPECT_EQ(TrainingDeviceOrdinal(3, 4, 4), 3);
  EXPECT_EQ(TrainingDeviceOrdinal(5, 8, 4), 1);  // as NCCL's device: local rank mod visible
  EXPECT_EQ(TrainingDeviceOrdinal(3, 4, 1), 0);  // srun --gpus-per-task=1: its only device
  EXPECT_EQ(TrainingDeviceOrdinal(2, 1, 4), 0);  // alone: the current device, never set
  EXPECT_EQ(TrainingDeviceOrdinal(1, 2, 0), 0);
}

TEST(TrainingDevice, NvmlIndexOfTheRanksDevice) {
  const std::vector<unsigned> all = {0, 1, 2, 3};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(TrainingGpu(all, r, 4), unsigned(r));
  EXPECT_EQ(TrainingGpu(all, 0, 1), 0u);
  EXPECT_EQ(TrainingGpu({2, 3}, 0, 2), 2u);  // CUDA_VISIBLE_DEVICES=2,3: ordinal 1 is GPU 3
  EXPECT_EQ(TrainingGpu({2, 3}, 1, 2), 3u);
  EXPECT_EQ(TrainingGpu({5}, 3, 8), 5u);
  EXPECT_FALSE(TrainingGpu({}, 0, 2).has_value());
}

// CUDA_VISIBLE_DEVICES set (or unset) for one scope.
class ScopedVisible {
 public:
  explicit ScopedVisible(const char* value) {
    if (const char* old = std::getenv("CUDA_VISIBLE_DEVICES")) old_ = old, had_ = true;
    if (value) setenv("CUDA_VISIBLE_DEVICES", value, 1);
    else unsetenv("CUDA_VISIBLE_DEVICES");
  }
  ~ScopedVisible() {
    if (had_) setenv("CUDA_VISIBLE_DEVICES", old_.c_str(), 1);
    else unsetenv("CUDA_VISIBLE_DEVICES");
  }

 private:
  std::string old_;
  bool had_ = false;
};

// Every label value `name` takes across the collector's series, and the series count.
std::set<std::string> LabelValues(const std::vector<prometheus::MetricFamily>& families,
                                  const std::string& name, size_t* series = nullptr) {
  std::set<std::string> out;
  for (const auto& f : families)
    for (const auto& m : f.metric) {
      if (series) ++*series;
      for (const auto& l : m.label)
        if (l.name == name) out.insert(l.value);
    }
  return out;
}

double UsedBytes(const std::vector<prometheus::MetricFamily>& families) {
  for (const auto& f : families)
    if (f.name == "forge_gpu_device_memory_bytes")
      for (const auto& m : f.metric)
        for (const auto& l : m.label)
          if (l.name == "kind" && l.value == "used") return m.gauge.value;
  return -1;
}

TEST(GpuHealthChoice, EachRankOfANodeExportsOnlyItsOwnGpu) {
  ScopedVisible unset(nullptr);
  std::set<std::string> claimed;
  for (int rank = 0; rank < 4; ++rank) {
    std::string why;
    auto c = GpuHealthCollector::Make("run-x", rank, /*local_rank=*/rank, /*world=*/4, &why,
                                      FORGE_FAKE_NVML);
    ASSERT_NE(c, nullptr) << why;
    EXPECT_EQ(c->nvml().device_count(), 4u);
    const auto families = c->Collect();
    size_t series = 0;
    const auto gpus = LabelValues(families, "gpu", &series);
    ASSERT_EQ(gpus, std::set<std::string>{std::to_string(rank)}) << "rank " << rank;
    // forge_gpu_info + used + total: one device's worth, not four.
    EXPECT_EQ(series, 3u) << "rank " << rank;
    EXPECT_EQ(LabelValues(families, "rank"), std::set<std::string>{std::to_string(rank)});
    EXPECT_EQ(LabelValues(families, "uuid"),
              std::set<std::string>{"GPU-00000000-0000-0000-0000-00000000000" +
                                    std::to_string(rank)});
    EXPECT_EQ(UsedBytes(families), double(uint64_t(rank) << 30));  // the sample is that device's
    EXPECT_TRUE(claimed.insert(*gpus.begin()).second) << "gpu " << *gpus.begin() << " twice";
  }
}

TEST(GpuHealthChoice, TheGpuLabelIsTheNvmlIndexOfTheVisibleDevice) {
  {
    ScopedVisible two("2,3");
    auto r0 = GpuHealthCollector::Make("run-x", 0, 0, 2, nullptr, FORGE_FAKE_NVML);
    auto r1 = GpuHealthCollector::Make("run-x", 1, 1, 2, nullptr, FORGE_FAKE_NVML);
    ASSERT_TRUE(r0 && r1);
    EXPECT_EQ(LabelValues(r0->Collect(), "gpu"), std::set<std::string>{"2"});
    EXPECT_EQ(LabelValues(r1->Collect(), "gpu"), std::set<std::string>{"3"});
  }
  {
    // srun --gpus-per-task=1 style: one visible device (by UUID prefix), any local rank.
    ScopedVisible one("GPU-00000000-0000-0000-0000-000000000001");
    auto c = GpuHealthCollector::Make("run-x", 3, 3, 4, nullptr, FORGE_FAKE_NVML);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->device(), 1u);
    EXPECT_EQ(LabelValues(c->Collect(), "gpu"), std::set<std::string>{"1"});
  }
  {
    // Alone with every GPU visible: it trains on (and reports) device 0 only.
    ScopedVisible unset(nullptr);
    auto c = GpuHealthCollector::Make("run-x", 0, 0, 1, nullptr, FORGE_FAKE_NVML);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(LabelValues(c->Collect(), "gpu"), std::set<std::string>{"0"});
  }
  {
    ScopedVisible none("7");  // names no device: nothing visible, no collector
    std::string why;
    EXPECT_EQ(GpuHealthCollector::Make("run-x", 0, 0, 1, &why, FORGE_FAKE_NVML), nullptr);
    EXPECT_NE(why.find("no visible GPU"), std::string::npos) << why;
  }
}

}  // namespace
}  // namespace forge
