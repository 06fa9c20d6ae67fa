#!/bin/bash
# Our FP8 gate/up GEMM with SwiGLU in the epilogue (Fp8Linears::fuse_swiglu_gemm, taken with
# precision.fp8.fast_accum fprop or fprop_dgrad) in ONE device call on one GPU: the single-GPU
# suite (SKIP_SUITE=1 leaves it out; FILTER=... narrows it), forge-wgmma-bench --only fp8
# (kernel times beside cuBLASLt; WGMMA=0 leaves it out), then forge-bench gpt350m FP8 + FP8 LM
# head with fast_accum FAST (default fprop) at micro-batch SIZES (default 16), AB_VAR (default
# FORGE_CUDA_SWIGLU_GEMM) =0 and =1 alternated for ROUNDS rounds (default 2), and once each
# fast_accum none and BF16 beside them.
# JSON lines in $OUT/bench.jsonl and $OUT/wgmma.jsonl.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
if [ -z "${SKIP_SUITE:-}" ]; then
  if [ -n "${FILTER:-}" ]; then SUITE_S=300 suite --gtest_filter="$FILTER"; else SUITE_S=300 suite; fi
fi
[ "${WGMMA:-1}" = 1 ] && timeout 120 .device/run forge-wgmma-bench --only fp8 2>&1 |
  tee -a "$out/wgmma.jsonl" | cut -c1-300
fast=${FAST:-fprop} var=${AB_VAR:-FORGE_CUDA_SWIGLU_GEMM}
for r in ${ROUNDS:-1 2}; do
  for b in ${SIZES:-16}; do
    for x in 0 1; do
      export "$var=$x"
      B=$b bench "fp8lm-$fast-b$b-$var=$x" forge-bench --precision fp8 --fp8-lm-head 1 \
        --fp8-fast-accum "$fast"
    done
    unset "$var"
    [ "$r" = 1 ] || continue
    B=$b bench "fp8lm-none-b$b" forge-bench --precision fp8 --fp8-lm-head 1 --fp8-fast-accum none
    B=$b bench "bf16-b$b" forge-bench --precision bf16
  done
done
echo "elapsed ${SECONDS}s"
