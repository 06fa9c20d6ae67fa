#!/bin/bash
# The copy-engine all-reduce (one device call, W GPUs): its tests with the other data-parallel
# ones, then forge-dist-bench ddp with NCCL's all-reduce and with FORGE_DP_COPY_ENGINE=require,
# alternating (each line with its own single-GPU baseline), then the copy-engine step profiled.
# Expects .device/ with forge_gpu_tests and forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
for i in ${ROUNDS:-1 2}; do
  run ddp X=nccl
  run ddp FORGE_DP_COPY_ENGINE=require
done
EXTRA=--profile run ddp FORGE_DP_COPY_ENGINE=require
echo "elapsed ${SECONDS}s"
