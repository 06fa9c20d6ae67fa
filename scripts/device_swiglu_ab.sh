#!/bin/bash
# SwiGLU's math and the SwiGLU-epilogue GEMM on one GPU in one device call (session 14): the GPU
# suite (FILTER; SKIP_SUITE=1 leaves it out), forge-wgmma-bench's fused rows, then forge-bench
# gpt350m BF16 --steps 30 at each micro-batch of BS (default "16 24"), ROUNDS rounds, three
# builds/settings alternated: base (.device/bin/forge-bench-base: the build before, expf and an
# IEEE reciprocal in the sigmoid), new with FORGE_CUDA_SWIGLU_GEMM=0 (the faster sigmoid only)
# and new with FORGE_CUDA_SWIGLU_GEMM=1. JSON lines in $OUT/bench.jsonl (label b<B>-<variant>).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || suite --gtest_brief=1 ${FILTER:+--gtest_filter=$FILTER}
timeout 120 .device/run forge-wgmma-bench --reps 20 --only fused > "$out/wgmma.jsonl" 2>&1
cut -c1-200 "$out/wgmma.jsonl"
for b in ${BS:-16 24}; do
  for r in ${ROUNDS:-1 2}; do
    FORGE_CUDA_SWIGLU_GEMM=0 B=$b bench "b$b-base" forge-bench-base --precision bf16
    FORGE_CUDA_SWIGLU_GEMM=0 B=$b bench "b$b-sig" forge-bench --precision bf16
    FORGE_CUDA_SWIGLU_GEMM=1 B=$b bench "b$b-sig-fused" forge-bench --precision bf16
  done
done
echo "elapsed ${SECONDS}s"
