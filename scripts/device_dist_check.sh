#!/bin/bash
# Multi-GPU check in one device call: the data-parallel and NCCL GPU tests, then
# forge-dist-bench for each mode beside the PyTorch DDP/FSDP anchor on the same GPUs.
#   scripts/device_dist_check.sh WORLD [MODEL] [B]   (expects a packed .device/ with the anchors)
set -u
W=${1:-2}; M=${2:-gpt350m}; B=${3:-16}
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 .device/run forge_gpu_tests --gtest_filter="${FORGE_TEST_FILTER:-*DataParallel*:*Nccl*}" 2>&1 | tail -40
for m in ${FORGE_MODES-ddp zero1 zero2 fsdp}; do
  timeout 200 .device/run forge-dist-bench --config configs/$M.yaml --world $W --mode $m --micro-batch $B --steps 20 2>&1 | tail -3
done
py=python3; /opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
for m in ${TORCH_MODES-ddp fsdp}; do
  (cd .device && timeout 300 $py -m torch.distributed.run --standalone --nproc_per_node=$W torch_dist.py $m $M $B 2>&1 | grep -E '^\{|Error' | tail -3)
done
