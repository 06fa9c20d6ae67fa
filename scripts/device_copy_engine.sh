#!/bin/bash
# ddp's all-reduce on the copy engines vs NCCL (one device call, W GPUs, default 4): the
# data-parallel and NCCL tests (the copy-engine ones among them; TESTS: another filter), then
# forge-dist-bench ddp with --ddp-allreduce nccl and copy_engine, alternating (ROUNDS; each
# line with its own single-GPU baseline), then the copy-engine step profiled (phases).
# Expects .device/ with forge_gpu_tests and forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
for i in ${ROUNDS:-1 2}; do
  run ddp X=nccl
  EXTRA="--ddp-allreduce copy_engine" run ddp X=copy_engine
done
EXTRA="--ddp-allreduce copy_engine --profile" run ddp X=copy_engine-profile
echo "elapsed ${SECONDS}s"
