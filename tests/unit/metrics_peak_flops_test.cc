// The dense BF16 peak table behind MFU (common/peak_flops.h), as forge-bench and /metrics use it.
#include <gtest/gtest.h>

#include "common/peak_flops.h"

namespace forge {
namespace {

TEST(PeakFlops, NamesAsCudaAndNvmlReportThem) {
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA H100 80GB HBM3"), 989.4);  // SXM
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA H100 NVL"), 835.5);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA H200 NVL"), 835.5);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA GH200 480GB"), 989.4);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA A100-PCIE-40GB"), 312.0);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA L40S"), 362.05);
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA L4"), 121.0);
}

TEST(PeakFlops, WholeWordsOnly) {
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA A10G"), 0.0);  // not an A10
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("NVIDIA L40"), 181.05);  // not an L4
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("nvidia h100 pcie"), 756.0);  // case-insensitive
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops("Tesla V100-SXM2-16GB"), 0.0);  // no BF16 tensor cores
  EXPECT_DOUBLE_EQ(DenseBf16PeakTflops(""), 0.0);
}

TEST(PeakFlops, Mfu) {
  // 1e5 tokens/s * 6e9 FLOPs/token = 600 TFLOP/s of 989.4.
  EXPECT_NEAR(ModelFlopsUtilization(1e5, 6e9, 989.4), 600.0 / 989.4, 1e-12);
  EXPECT_EQ(ModelFlopsUtilization(1e5, 6e9, 0.0), 0.0);
}

}  // namespace
}  // namespace forge
