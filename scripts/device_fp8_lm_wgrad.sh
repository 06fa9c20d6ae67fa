#!/bin/bash
# The FP8 LM head's weight gradient in FP8 (Fp8Linears::lm_head_wgrad, session 16) in ONE device
# call on one GPU (~7 min): the GPU tests it touches (FILTER, or the default list below;
# SKIP_SUITE=1 leaves them out), forge-wgmma-bench --only fp8, then forge-bench gpt350m B 16
# FP8 + FP8 LM head with FORGE_CUDA_FP8_LM_WGRAD=0 and =1 alternated (scripts/
# device_fp8_swiglu_gemm.sh, two rounds, BF16 and fast_accum none once), then gpt124m's
# 2000-step accuracy runs on the real corpus (scripts/device_fp8_accuracy.sh): FP8 + FP8 LM
# head with the default fast_accum fprop, and with ACC_BF16=1 BF16 as the same-call reference.
# JSON lines in $OUT/bench.jsonl and $OUT/wgmma.jsonl, metrics in $OUT/fp8lm.jsonl (bf16.jsonl).
set -u
cd "$(dirname "$0")/.."
FILTER=${FILTER:-'GpuByteTranspose.*:GpuCrossEntropy.*:GpuRopeFp8.*:GpuFp8Step.*:Recipes/GpuFp8Model.*:GpuWgmmaGemm.*:GpuModel.*'} \
  AB_VAR=FORGE_CUDA_FP8_LM_WGRAD bash scripts/device_fp8_swiglu_gemm.sh
out=${OUT:-/tmp/out}
source scripts/device_fp8_accuracy.sh
acc_config fp8lm fp8 true fprop
acc_run fp8lm
if [ "${ACC_BF16:-0}" = 1 ]; then
  acc_config bf16 bf16 false
  acc_run bf16
fi
echo "elapsed ${SECONDS}s"
