#!/bin/bash
# parallel.grad_reduce (issue 5) in one device call on a 4-GPU machine (stops starting new items
# after ~540 s): the bf16 cast and data-parallel GPU tests (the fp32 cases too, as the baseline),
# then forge-dist-bench fp32 vs bf16 gradient collectives for ddp/zero1/zero2 on 4 GPUs and ddp
# on 2, each pair back to back on the same GPUs. Expects .device/ (forge_gpu_tests,
# forge-dist-bench) as scripts/device_issue5.sh does.
set -u
cd "$(dirname "$0")/.."
M=${M:-gpt350m}; B=${B:-16}
left() { [ $SECONDS -lt ${1:-${DEADLINE:-540}} ]; }
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
timeout 240 .device/run forge_gpu_tests \
  --gtest_filter='GpuGradReduceCast.*:GpuCast.*:Modes/CudaDataParallelTest.*' 2>&1 |
  grep -E "^\[       OK|^\[  FAILED|PASSED|SKIPPED \]|Failure|error|Expected|Which is|actual" | head -60
bench() {
  left && timeout 100 .device/run forge-dist-bench --config configs/$M.yaml --world $1 --mode $2 \
    --grad-reduce $3 --micro-batch $B --steps 20 2>&1 | grep '^{'
}
for m in ddp zero1 zero2; do bench 4 $m fp32; bench 4 $m bf16; done
bench 2 ddp fp32; bench 2 ddp bf16
echo "elapsed ${SECONDS}s"
