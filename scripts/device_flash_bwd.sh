#!/bin/bash
# Our own attention backward (SdpaBackwardKernel::kFlash) on one GPU in one device call: its GPU
# tests (GpuFlashBackward.*, under a time limit: a kernel waiting on a semaphore forever would
# show here as a timeout), forge-sdpa-bench for gpt350m's shape (cuDNN's engines and ours on
# the same operands), then (AB=1) forge-bench gpt350m with FORGE_CUDA_ATTN_BWD=cudnn and =flash
# alternated, BF16 and FP8 + FP8 LM head at B 16, ROUNDS rounds; (SUITE=1) the whole suite first.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SUITE:-}" ] && SUITE_S=400 suite
timeout ${FLASH_S:-240} .device/run forge_gpu_tests --gtest_filter="${FILTER:-GpuFlashBackward.*}" \
  > "$out/flash.txt" 2>&1
echo "flash tests rc $?"
grep -E "^\[ +(OK|FAILED) |flash bwd|Failure|Expected|Which is|Value of|rel|error" "$out/flash.txt" | head -60
timeout ${SDPA_S:-200} .device/run forge-sdpa-bench --no-tune --only gpt350m > "$out/sdpa.jsonl" 2>&1
echo "sdpa bench rc $?"
grep -E '"kind":"bwd' "$out/sdpa.jsonl" | sed -E 's/"engines":\[[^]]*\]//' | cut -c1-600
tail -2 "$out/sdpa.jsonl" | cut -c1-800
if [ -n "${AB:-}" ]; then
  for r in ${ROUNDS:-1 2}; do
    for x in cudnn flash; do
      export FORGE_CUDA_ATTN_BWD=$x
      bench "bf16-b16-$x" forge-bench --precision bf16
      bench "fp8lm-b16-$x" forge-bench --precision fp8 --fp8-lm-head 1
    done
  done
fi
echo "elapsed ${SECONDS}s"
