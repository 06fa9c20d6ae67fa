// Dense BF16 tensor-core peaks by device name: the denominator of MFU, shared by forge-bench
// and the /metrics exporter so both report the same ratio. Figures are NVIDIA's datasheet
// numbers without structured sparsity.
#pragma once

#include <string_view>

namespace forge {

// TFLOP/s for a device name as CUDA or NVML report it ("NVIDIA H100 80GB HBM3",
// "NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe"); 0 when the device is not in the table.
// The name is split into words at spaces and hyphens and matched case-insensitively on whole
// words, so "A10G" is not an "A10" and "L40S" not an "L4".
double DenseBf16PeakTflops(std::string_view device_name);

// Model FLOPs utilisation: achieved model FLOP/s over the peak; 0 when the peak is unknown.
double ModelFlopsUtilization(double tokens_per_s, double flops_per_token, double peak_tflops);

}  // namespace forge
