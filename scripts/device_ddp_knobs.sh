#!/bin/bash
# ddp's exposed communication under every knob tried in session 4 (one device call, 4 GPUs;
# stops starting new items after ~540 s): the 2/4-GPU tests, then forge-dist-bench ddp on 4
# GPUs with NCCL's defaults, NCCL_CTA_POLICY_EFFICIENCY (FORGE_NCCL_CTA_POLICY=1), capped NCCL
# CTAs with backward GEMMs that leave as many SMs (FORGE_NCCL_MAX_CTAS, FORGE_GEMM_SM_MARGIN),
# the weight-gradient stream's priority or none, NCCL protocol / P2P read / buffer size, and
# the collectives skipped (diagnosis only: wrong training); then ddp and zero1 with --profile
# (which phases the collectives slow). Each line has its own single-GPU baseline.
# Expects .device/ with forge_gpu_tests and forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
run ddp X=default
run ddp FORGE_NCCL_CTA_POLICY=1
run ddp FORGE_NCCL_CTA_POLICY=1 FORGE_GEMM_SM_MARGIN=8
for k in 4 8 16; do run ddp FORGE_NCCL_MAX_CTAS=$k FORGE_GEMM_SM_MARGIN=$k; done
run ddp FORGE_CUDA_WGRAD_PRIORITY=high
run ddp FORGE_CUDA_WGRAD_STREAM=0
for e in NCCL_PROTO=Simple NCCL_PROTO=LL128 NCCL_P2P_READ_ENABLE=1 NCCL_BUFFSIZE=16777216; do
  run ddp $e
done
run ddp FORGE_DP_DIAG_SKIP_GRAD_COMM=1
run zero1 FORGE_NCCL_MAX_CTAS=16 FORGE_GEMM_SM_MARGIN=16
run fsdp FORGE_NCCL_MAX_CTAS=16 FORGE_GEMM_SM_MARGIN=16
EXTRA=--profile run ddp X=profile
EXTRA=--profile run zero1 X=profile
echo "elapsed ${SECONDS}s"
