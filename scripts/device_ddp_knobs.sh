#!/bin/bash
# ddp's exposed communication under NCCL's CTA knobs (one device call, 4 GPUs): the 2/4-GPU
# tests first, then forge-dist-bench ddp on 4 GPUs with NCCL's default CTAs, with
# NCCL_CTA_POLICY_EFFICIENCY (FORGE_NCCL_CTA_POLICY=1), and with that plus backward GEMMs that
# leave SMs to NCCL (FORGE_GEMM_SM_MARGIN); zero1 and fsdp for reference. Each line has its own
# single-GPU baseline. Expects .device/ with forge_gpu_tests and forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
M=${M:-gpt350m}; B=${B:-16}
left() { [ $SECONDS -lt ${1:-540} ]; }
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
timeout 150 .device/run forge_gpu_tests --gtest_filter='*DataParallel*:*Nccl*' 2>&1 |
  grep -E "^\[       OK|^\[  FAILED|PASSED|SKIPPED \]|Failure|error" | head -40
bench() { left && timeout 100 env "$@" .device/run forge-dist-bench --config configs/$M.yaml \
  --world 4 --mode ${MODE:-ddp} --micro-batch $B --steps 20 2>&1 | grep '^{' | sed "s/^/$* /"; }
bench X=default
bench FORGE_NCCL_CTA_POLICY=1
bench FORGE_NCCL_CTA_POLICY=1 FORGE_GEMM_SM_MARGIN=8
bench FORGE_NCCL_MAX_CTAS=8 FORGE_GEMM_SM_MARGIN=8
MODE=zero1 bench FORGE_NCCL_CTA_POLICY=1
echo "elapsed ${SECONDS}s"
