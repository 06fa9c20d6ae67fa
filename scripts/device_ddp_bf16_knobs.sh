#!/bin/bash
# ddp with bf16 gradient collectives under the knobs that may matter now that each block's
# all-reduce is half as long (one multi-GPU device call, ~300 s; stops starting new items after
# ~540 s): the NCCL tests, then forge-dist-bench gpt350m B 16 ddp on W GPUs (default 4), ROUNDS
# rounds (default 2) of: fp32 collectives, bf16, bf16 with NCCL capped at 8 and 16 CTAs
# (FORGE_NCCL_MAX_CTAS: a bf16 block all-reduce may now fit its comm window with fewer SMs), bf16
# with the collectives started at once (FORGE_DP_COMM_WINDOW=0); then one bf16 --profile run
# (rank 0's phases, single GPU vs ddp, eager single-stream). The bf16 lines sum gradients in
# bf16: report them as that.
set -u
cd "$(dirname "$0")/.."
TESTS=${TESTS:-NcclComm.*}
source scripts/device_dp_preamble.sh
for r in ${ROUNDS:-1 2}; do
  run ddp
  EXTRA="--grad-reduce bf16" run ddp
  EXTRA="--grad-reduce bf16" run ddp FORGE_NCCL_MAX_CTAS=8
  EXTRA="--grad-reduce bf16" run ddp FORGE_NCCL_MAX_CTAS=16
  EXTRA="--grad-reduce bf16" run ddp FORGE_DP_COMM_WINDOW=0
done
EXTRA="--grad-reduce bf16 --profile" run ddp
echo "elapsed ${SECONDS}s"
