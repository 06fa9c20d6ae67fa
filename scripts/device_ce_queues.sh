#!/bin/bash
# ddp's copy-engine all-reduce with 16 hardware queues instead of 32 (one multi-GPU device
# call). Session 12 measured 32 queues (CUDA_DEVICE_MAX_CONNECTIONS, which the copy engines
# ask for) slowing a single-GPU step by ~2%. First the copy-engine tests with 16 queues, then
# forge-dist-bench gpt350m B 16 ddp on 4 and 2 GPUs: copy engines with 16 and 32 queues and
# NCCL (8, the default) alternated, ROUNDS rounds on 4 GPUs (default 2), one on 2.
set -u
cd "$(dirname "$0")/.."
export CUDA_DEVICE_MAX_CONNECTIONS=16
TESTS=${TESTS:-CopyEngine*}
source scripts/device_dp_preamble.sh
unset CUDA_DEVICE_MAX_CONNECTIONS
ce() { EXTRA="--ddp-allreduce copy_engine" run ddp "$@"; }
three() { ce CUDA_DEVICE_MAX_CONNECTIONS=16; ce CUDA_DEVICE_MAX_CONNECTIONS=32; run ddp; }
for r in ${ROUNDS:-1 2}; do W=4 three; done
W=2 three
echo "elapsed ${SECONDS}s"
