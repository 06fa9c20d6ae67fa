#!/bin/bash
# ddp's tail and SM cost (one device call, W GPUs, default 4): the data-parallel and NCCL tests
# (copy engine and embedding gather among them; TESTS: another filter), then forge-dist-bench
# ddp with NCCL's all-reduce, with the copy engines (--ddp-allreduce copy_engine), with the
# embedding gather (FORGE_DP_EMBEDDING_GATHER=1) and with both, alternating (ROUNDS; each line
# with its own single-GPU baseline), then the last variant profiled (phases).
# Expects .device/ with forge_gpu_tests and forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
CE="--ddp-allreduce copy_engine"
for i in ${ROUNDS:-1 2}; do
  run ddp X=nccl
  EXTRA="$CE" run ddp X=copy_engine
  run ddp FORGE_DP_EMBEDDING_GATHER=1
  EXTRA="$CE" run ddp FORGE_DP_EMBEDDING_GATHER=1 X=copy_engine
done
EXTRA="$CE --profile" run ddp FORGE_DP_EMBEDDING_GATHER=1 X=copy_engine-profile
echo "elapsed ${SECONDS}s"
