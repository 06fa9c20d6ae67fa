#!/bin/bash
# The whole GPU test suite, then `forge train` exactly as a user runs it on a 2-GPU machine
# (no launcher variables: an in-process coordinator, this process as rank 0 on GPU 0 and a
# forge-worker for GPU 1, the NCCL id relayed by the coordinator), on gpt124m with the small real
# dataset (.devdata/mini.tar.xz). Expects .device/ with forge, forge-worker, forge_gpu_tests.
set -u
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
timeout 260 .device/run forge_gpu_tests 2>&1 | grep -E "^\[  FAILED|PASSED|SKIPPED \]|tests ran|Failure" | head -30
export FORGE_DATA_DIR=/tmp/fd
mkdir -p $FORGE_DATA_DIR && tar -xJf .devdata/mini.tar.xz -C $FORGE_DATA_DIR
sed "s/every_steps: 250/every_steps: 20/" configs/gpt124m.yaml > /tmp/g.yaml
timeout 150 .device/run forge train /tmp/g.yaml --steps 40 --run-dir /tmp/run_local 2>&1 | tail -12
