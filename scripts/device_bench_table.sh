#!/bin/bash
# The issue-3 table in ONE device call: forge-bench for gpt350m and gpt124m at micro-batch
# 8, 16, 24, then the PyTorch anchor (compiled) for the same models and micro-batches, on the
# same GPU. Expects a packed .device/ with forge-bench and the anchors copied in.
#   .device/run is the packer's wrapper; results go to $OUT/table.jsonl.
set -u
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
for m in gpt350m gpt124m; do
  for b in 8 16 24; do
    .device/run forge-bench --config configs/$m.yaml --micro-batch $b --steps 30 2>&1 | tee -a $out/table.jsonl
  done
done
py=python3
/opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
(cd .device && PYTHONUNBUFFERED=1 $py torch_baseline.py gpt350m:8:c gpt350m:16:c gpt350m:24:c \
   gpt124m:8:c gpt124m:16:c gpt124m:24:c 2>&1 | grep '^{' | tee -a $out/table.jsonl)
