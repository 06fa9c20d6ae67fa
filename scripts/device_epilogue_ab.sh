#!/bin/bash
# The fused-epilogue GEMMs on one GPU in one device call: the GPU suite (FILTER, default all;
# SKIP_SUITE=1 leaves it out), forge-wgmma-bench (our GEMM beside cuBLASLt, the fused epilogues
# beside cuBLASLt + kernel; WGMMA_ONLY=S passes --only S), then forge-bench gpt350m --steps 30
# BF16 at each micro-batch of BS (default 16) with FORGE_CUDA_ROPE_GEMM / FORGE_CUDA_SWIGLU_GEMM
# as VARIANTS says (default "0 0,1 0,1 1"), alternated, ROUNDS rounds. JSON lines in
# $OUT/wgmma.jsonl and $OUT/bench.jsonl (label b<B>-rope<0|1>-swiglu<0|1>), a summary line per
# run.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || suite --gtest_brief=1 ${FILTER:+--gtest_filter=$FILTER}
timeout 120 .device/run forge-wgmma-bench --reps 20 ${WGMMA_ONLY:+--only $WGMMA_ONLY} > "$out/wgmma.jsonl" 2>&1
cut -c1-200 "$out/wgmma.jsonl"
for b in ${BS:-16}; do
  for r in ${ROUNDS:-1 2}; do
    IFS=, read -ra variants <<< "${VARIANTS:-0 0,1 0,1 1}"
    for v in "${variants[@]}"; do
      set -- $v
      FORGE_CUDA_ROPE_GEMM=$1 FORGE_CUDA_SWIGLU_GEMM=$2 B=$b bench "b$b-rope$1-swiglu$2" \
        forge-bench --precision bf16
    done
  done
done
echo "elapsed ${SECONDS}s"
