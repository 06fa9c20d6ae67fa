#!/bin/bash
# Comm windows (one device call, 4 GPUs): the 2/4-GPU tests, then forge-dist-bench on 4 GPUs:
# ddp with the gradient collectives started in the next block's attention backward (default)
# and at once (FORGE_DP_COMM_WINDOW=0), twice each; ddp in windows with NCCL capped at 8 / 16
# CTAs and with bf16 gradient all-reduces; zero1 and fsdp; ddp with --profile (which phases
# the collectives slow). Each line has its own single-GPU baseline.
# Expects .device/ with forge_gpu_tests and forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
run ddp X=windows
run ddp FORGE_DP_COMM_WINDOW=0
run ddp FORGE_NCCL_MAX_CTAS=8
run ddp FORGE_NCCL_MAX_CTAS=16
EXTRA="--grad-reduce bf16" run ddp X=bf16-grads
run ddp X=windows
run ddp FORGE_DP_COMM_WINDOW=0
run zero1 X=windows
run fsdp X=default
EXTRA=--profile run ddp X=windows-profile
echo "elapsed ${SECONDS}s"
