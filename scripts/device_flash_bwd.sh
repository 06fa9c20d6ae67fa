#!/bin/bash
# Our own attention backward (SdpaBackwardKernel::kFlash, the default; FORGE_CUDA_ATTN_BWD=cudnn
# for cuDNN's) on one GPU in one device call: its GPU tests (*FlashBackward*, run REPEAT times
# under a hard time limit; a hang is killed and the GPU waited on, so it cannot stall the rest
# of the call as it did in session 17), forge-sdpa-bench for gpt350m's shape (cuDNN's
# engines and ours on the same operands), then (AB=1) forge-bench gpt350m with
# FORGE_CUDA_ATTN_BWD=cudnn and =flash alternated, BF16 and FP8 + FP8 LM head at B 16, ROUNDS
# rounds, then (ANCHOR=1) the PyTorch anchor at B 16; (SUITE=1) the whole suite first.
# Expects .device/ with forge_gpu_tests, forge-sdpa-bench and forge-bench (../shared/device/pack).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SUITE:-}" ] && SUITE_S=400 suite
hard ${FLASH_S:-120} .device/run forge_gpu_tests --gtest_filter="${FILTER:-*FlashBackward*}" \
  --gtest_repeat=${REPEAT:-3} > "$out/flash.txt" 2>&1
rc=$?
echo "flash tests rc $rc"
[ $rc = 0 ] || { grep -E "^\[ RUN" "$out/flash.txt" | tail -1; echo "stopping: flash tests did not pass"; exit 1; }
grep -E "^\[ +(OK|FAILED) |flash bwd|Failure|Expected|Which is|Value of|rel|error" "$out/flash.txt" | head -60
hard ${SDPA_S:-120} .device/run forge-sdpa-bench --no-tune --only gpt350m > "$out/sdpa.jsonl" 2>&1
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
[ -n "${ANCHOR:-}" ] && anchor ${ANCHOR_S:-240} gpt350m:16:c
echo "elapsed ${SECONDS}s"
