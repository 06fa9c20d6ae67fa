#!/bin/bash
# Branch ddp-bf16-grads' first GPU call (one multi-GPU device call): the multi-GPU tests and
# the AdamW tests (GpuAdamW.Bf16GradientsAreTheWidenedFp32Ones among them), then
# forge-dist-bench gpt350m B 16 ddp with fp32 and bf16 gradient collectives alternated, ROUNDS
# rounds on 4 GPUs (default 2) and one on 2. The bf16 lines sum gradients in bf16 (W roundings
# per element): report them as that, never as the fp32 default. Their "comm alone" still times
# a cast before and a widening after each collective, which the step no longer runs.
set -u
cd "$(dirname "$0")/.."
TESTS=${TESTS:-*DataParallel*:*Nccl*:GpuAdamW*:GpuGradNorm*}
source scripts/device_dp_preamble.sh
ab() { run ddp; EXTRA="--grad-reduce bf16" run ddp; }
for r in ${ROUNDS:-1 2}; do W=4 ab; done
W=2 ab
echo "elapsed ${SECONDS}s"
