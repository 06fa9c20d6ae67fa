#!/bin/bash
# The RMSNorm backward's dw reductions on the wgrad stream (CudaModelOptions::norm_dw_on_wgrad,
# FORGE_CUDA_NORM_DW_WGRAD=0 | 1), A/B on one GPU in one device call: the whole single-GPU
# suite first (SKIP_SUITE skips it), then forge-bench gpt350m BF16 at B 16 and 24 and FP8 +
# FP8 LM head at B 16, off / on alternated, ROUNDS rounds (default 2). JSON lines in
# $OUT/bench.jsonl. (Session 11 ran this beside softmax_sum from a kernel of ours as an input
# of cuDNN's backward graph, which cuDNN refuses: see docs/benchmarks.md.)
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || SUITE_S=300 suite
for r in ${ROUNDS:-1 2}; do
  for b in 16 24; do
    for dw in 0 1; do
      FORGE_CUDA_NORM_DW_WGRAD=$dw B=$b bench "bf16-b$b-dw$dw" forge-bench --precision bf16
    done
  done
  for dw in 0 1; do
    FORGE_CUDA_NORM_DW_WGRAD=$dw bench "fp8lm-b16-dw$dw" forge-bench --precision fp8 --fp8-lm-head 1
  done
done
echo "elapsed ${SECONDS}s"
