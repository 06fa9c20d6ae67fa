#!/bin/bash
# Issues 3 and 4's table in ONE device call on one GPU: the whole GPU suite, then forge-bench in
# BF16, FP8 and FP8 with the LM head in FP8 (gpt350m at micro-batch 8, 16, 24; gpt124m at 16)
# and the compiled PyTorch anchor for the same shapes, all on the same GPU; then one profiled
# step of each precision (gpt350m B 16). Expects .device/ with forge_gpu_tests, forge-bench and
# the anchors. Results: $OUT. SKIP_SUITE=1 leaves the suite out, SKIP_PROFILE=1 the profiles,
# DEFER_OFF=1 adds BF16 with the AdamW update at the step's end (not deferred), NORM_DW_OFF=1
# BF16 with the RMSNorm dw reductions on the chain's stream, SUITE_ONLY=1 stops after the suite.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh  # $out, the GPU's line, suite, anchor
if [ -z "${SKIP_SUITE:-}" ]; then  # SKIP_SUITE=1: the suite already ran on these binaries
  SUITE_S=240 suite
  echo "suite done at ${SECONDS}s"
  [ -n "${SUITE_ONLY:-}" ] && exit 0
fi
for mb in gpt350m:8 gpt350m:16 gpt350m:24 gpt124m:16; do
  # fp8:lm = FP8 with the LM head's logits GEMM in FP8 too; bf16:off (DEFER_OFF=1) = BF16 with
  # the AdamW update at the end of the step (FORGE_CUDA_DEFER_UPDATE=0; its JSON says so).
  # bf16:dwoff (NORM_DW_OFF=1) = BF16 with the RMSNorm dw reductions on the chain's stream.
  for p in bf16 $([ -n "${DEFER_OFF:-}" ] && echo bf16:off) \
      $([ -n "${NORM_DW_OFF:-}" ] && echo bf16:dwoff) fp8 fp8:lm; do
    env $([ $p = bf16:off ] && echo FORGE_CUDA_DEFER_UPDATE=0) \
      $([ $p = bf16:dwoff ] && echo FORGE_CUDA_NORM_DW_WGRAD=0) .device/run forge-bench \
      --config configs/${mb%%:*}.yaml --micro-batch ${mb##*:} --steps 30 --precision ${p%%:*} \
      $([ $p = fp8:lm ] && echo --fp8-lm-head 1) 2>&1 | grep '^{' | tee -a "$out/bench.jsonl"
  done
done
for p in $([ -z "${SKIP_PROFILE:-}" ] && echo bf16 fp8); do  # SKIP_PROFILE=1: none
  .device/run forge-bench --config configs/gpt350m.yaml --micro-batch 16 --precision $p --profile \
    2>&1 | grep '^{' | tee -a "$out/profile.jsonl"
done
anchor 300 gpt350m:8:c gpt350m:16:c gpt350m:24:c gpt124m:16:c
