#!/bin/bash
# Comm windows A/B (one device call, 4 GPUs): the 2/4-GPU tests, then forge-dist-bench on 4
# GPUs with the gradient collectives started in the next block's attention backward (default)
# and at once (FORGE_DP_COMM_WINDOW=0), alternated, for ddp and zero1; then ddp with --profile
# both ways (which phases the collectives slow). Each line has its own single-GPU baseline.
# Expects .device/ with forge_gpu_tests and forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
run() {  # run MODE [ENV=VALUE ...]
  local mode=$1; shift
  left && timeout 100 env "$@" .device/run forge-dist-bench --config configs/$M.yaml --world 4 \
    --mode $mode --micro-batch $B --steps 20 ${EXTRA:-} 2>&1 | grep '^{' | sed "s/^/$mode $* /"
}
for rep in 1 2; do
  run ddp FORGE_DP_COMM_WINDOW=1
  run ddp FORGE_DP_COMM_WINDOW=0
done
run zero1 FORGE_DP_COMM_WINDOW=1
run zero1 FORGE_DP_COMM_WINDOW=0
EXTRA=--profile run ddp FORGE_DP_COMM_WINDOW=1
EXTRA=--profile run ddp FORGE_DP_COMM_WINDOW=0
echo "elapsed ${SECONDS}s"
