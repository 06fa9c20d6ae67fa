// The numbers `forge plan`'s cost model runs on (plan/plan_model.h), in one structure: achieved
// compute and memory-bandwidth rates of the training step on one GPU, the bandwidth and latency
// of NCCL's collectives over each kind of link, how much of the collective time the step fails
// to hide, and the GPU's memory. Built-in defaults exist for H200 and H100, derived from the
// project's measurements (docs/performance.md; each default says where it comes from in
// plan_calibration.cc); a calibration file written by forge-calibrate (bench/calibrate.cc)
// replaces any of them.
//
// File format (JSON; every key optional, an unknown key is an error naming the file and key):
//   {"format": "forge-calibration/1", "device": "NVIDIA H200",
//    "peak_bf16_tflops": 989.4,
//    "compute": {"gemm_tflops_max": ..., "gemm_half_width": ..., "fp8_gemm_speedup": ...,
//                "attention_tflops_max": ..., "attention_half_seq": ..., "hbm_gb_s": ...,
//                "elementwise_bytes": ..., "fp8_elementwise_bytes": ..., "logits_bytes": ...,
//                "optimizer_bytes_per_param": ...},
//    "memory": {"capacity_gib": ..., "overhead_gib": ...},
//    "links": {"nvlink"|"ib400"|"eth100": {"allreduce_gb_s": ..., "reduce_scatter_gb_s": ...,
//              "base_latency_us": ..., "hop_latency_us": ..., "per_node": false}},
//    "overlap": {"gradient_exposed_fraction": ..., "sharded_exposed_fraction": ...},
//    "measured": {...}}   (forge-calibrate's raw measurements: kept for the record, not read)
#pragma once

#include <string>

#include "common/status.h"

namespace forge::plan {

// One kind of link, as NCCL's collectives see it. Bandwidths are bus bandwidths (nccl-tests'
// busbw: the bytes a rank sends in the ring algorithm over the time), for messages of the
// sizes a training step's units have.
struct LinkCalibration {
  double allreduce_gb_s = 0;       // all-reduce bus bandwidth, GB/s
  double reduce_scatter_gb_s = 0;  // reduce-scatter and all-gather bus bandwidth, GB/s
  double base_latency_us = 0;      // per collective, whatever its size
  double hop_latency_us = 0;       // per ring step (2(N-1) for an all-reduce ring, N-1 else)
  // Network links: false, the bandwidth is each GPU's own NIC (a node of G GPUs has G of
  // them); true, one NIC per node that its GPUs share.
  bool per_node = false;
};

struct PlanCalibration {
  std::string device = "NVIDIA H200";
  std::string source = "built-in";  // "built-in (H200)" or the calibration file's path
  double peak_bf16_tflops = 989.4;  // MFU's denominator (common/peak_flops.h)

  // --- one GPU's training step ---
  // BF16 GEMMs run at gemm_tflops_max * d / (d + gemm_half_width) TFLOP/s in the step (d =
  // model.d_model): narrow models' GEMMs fill the GPU less well.
  double gemm_tflops_max = 0;
  double gemm_half_width = 0;
  double fp8_gemm_speedup = 0;  // FP8 GEMMs' rate over BF16's, in the step
  // Causal attention at attention_tflops_max * T / (T + attention_half_seq) model TFLOP/s
  // (model FLOPs: 12 L (H hd) T a token, forward and backward together).
  double attention_tflops_max = 0;
  double attention_half_seq = 0;
  double hbm_gb_s = 0;  // what the bandwidth-bound kernels reach in the step
  // HBM bytes of the elementwise work (norms, RoPE, residual casts) per layer, d_model column
  // and token; FP8 adds fp8_elementwise_bytes (casts, transposed copies).
  double elementwise_bytes = 0;
  double fp8_elementwise_bytes = 0;
  double logits_bytes = 0;               // cross-entropy, per vocabulary entry and token
  double optimizer_bytes_per_param = 0;  // AdamW's HBM traffic per parameter it updates

  // --- memory ---
  double capacity_gib = 0;  // what a process can allocate on the GPU
  // Beyond worker/train/memory_estimate.h's count: cuBLASLt / cuDNN handles and the kernels
  // they load, the CUDA graph, small scratch, allocation rounding.
  double overhead_gib = 0;

  // --- links ---
  LinkCalibration nvlink;  // inside a node (and across nodes with --link nvlink)
  LinkCalibration ib400;   // InfiniBand, 400 Gb/s per GPU
  LinkCalibration eth100;  // Ethernet, 100 Gb/s per node

  // --- overlap ---
  // Of a collective that runs beside the backward, the fraction that still lengthens the step
  // (SM contention with the GEMMs, waits): ddp's all-reduces, zero's reduce-scatters.
  double gradient_exposed_fraction = 0;
  // The same for the sharded modes' parameter all-gathers and fsdp's collectives.
  double sharded_exposed_fraction = 0;
};

// Built-in calibration for a GPU: "h200" or "h100" (case-insensitive); InvalidArgument else.
StatusOr<PlanCalibration> BuiltinCalibration(const std::string& gpu);

// `base` with what the JSON text gives replacing its numbers. `what` names the text in errors
// (the file's path): "calib.json: links.ib400.allreduce_gb_s: expected a number > 0".
StatusOr<PlanCalibration> ParseCalibration(const std::string& json_text, const std::string& what,
                                           PlanCalibration base);
// The same from a file.
StatusOr<PlanCalibration> LoadCalibration(const std::string& path, PlanCalibration base);

// The calibration as a file ParseCalibration reads back (without "measured").
std::string CalibrationToJson(const PlanCalibration& c);

}  // namespace forge::plan
