#!/bin/bash
# One multi-GPU device call for issues 8, 4 and 5: per-rank /metrics of a 2-GPU `forge train`
# (run_id, per-rank tokens/s and MFU, one GPU's health per rank), an FP8 `forge train` on 2 GPUs
# (ddp), then scripts/device_grad_reduce.sh (bf16 gradient collectives: tests + benchmarks) with
# what time is left. Expects .device/ with forge, forge-worker, forge_gpu_tests, forge-dist-bench.
set -u
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
echo "===== metrics (2 GPUs)"
CUDA_VISIBLE_DEVICES=0,1 bash scripts/device_metrics_check.sh 2>&1 | tail -32
echo "===== fp8 ddp (2 GPUs)"
export FORGE_DATA_DIR=/tmp/fd
sed -e "s/compute: bf16/compute: fp8/" -e "s/every_steps: 250/every_steps: 20/" configs/gpt124m.yaml > /tmp/f8.yaml
CUDA_VISIBLE_DEVICES=0,1 timeout 150 .device/run forge train /tmp/f8.yaml --steps 60 --checkpoint-every 0 \
  --run-dir /tmp/run_f8 2>&1 | grep -E "^step|done|rror|skipped" | tail -9
echo "===== grad_reduce (elapsed ${SECONDS}s)"
DEADLINE=$((530 - SECONDS)) bash scripts/device_grad_reduce.sh 2>&1
