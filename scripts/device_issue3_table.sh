#!/bin/bash
# Issue 3's table in ONE device call on one GPU (~9 min): forge-bench BF16 (config recipe) for
# gpt350m and gpt124m at micro-batch 8, 16, 24, gpt350m again with --recipe torch (the anchor's
# initialisation and AdamW), the phase profile of gpt350m B 16 (--profile: eager, one stream,
# events between phases), then the compiled PyTorch anchor for the same six shapes on the same
# GPU. JSON lines in $OUT/bench.jsonl (label <model>-b<B>-<recipe>), the anchor's with its own.
# TORCH_RECIPE=0 leaves the torch-recipe rows out; AB_VAR=FORGE_... adds gpt350m B 16 and 24 with
# that switch at 0 and 1 (alternated, before the anchor); FP8_ROW=1 adds gpt350m B 16 and 24 in
# FP8 with the FP8 LM head (issue 4's rows).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
one() {  # model B recipe [extra flags]
  local m=$1 b=$2 rec=$3
  shift 3
  timeout 90 .device/run forge-bench --config configs/$m.yaml --micro-batch $b --steps 30 \
    --precision bf16 --recipe $rec "$@" 2>&1 | grep '^{' |
    sed "s|^{|{\"label\":\"$m-b$b-$rec$*\",|" | tee -a "$out/bench.jsonl" | cut -c1-400
}
for m in gpt350m gpt124m; do for b in 8 16 24; do one $m $b config; done; done
[ "${TORCH_RECIPE:-1}" = 1 ] && for b in 8 16 24; do one gpt350m $b torch; done
one gpt350m 16 config --profile
if [ -n "${AB_VAR:-}" ]; then
  for b in 16 24; do for x in 0 1; do
    env "$AB_VAR=$x" .device/run forge-bench --config configs/gpt350m.yaml --micro-batch $b \
      --steps 30 --precision bf16 2>&1 | grep '^{' |
      sed "s|^{|{\"label\":\"gpt350m-b$b-$AB_VAR=$x\",|" | tee -a "$out/bench.jsonl" | cut -c1-200
  done; done
fi
if [ "${FP8_ROW:-0}" = 1 ]; then
  for b in 16 24; do
    timeout 90 .device/run forge-bench --config configs/gpt350m.yaml --micro-batch $b --steps 30 \
      --precision fp8 --fp8-lm-head 1 2>&1 | grep '^{' |
      sed "s|^{|{\"label\":\"gpt350m-b$b-fp8lm\",|" | tee -a "$out/bench.jsonl" | cut -c1-200
  done
fi
echo "forge done at ${SECONDS}s"
py=python3
/opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
(cd .device && PYTHONUNBUFFERED=1 timeout $((570 - SECONDS)) $py torch_baseline.py gpt350m:8:c \
   gpt350m:16:c gpt350m:24:c gpt124m:8:c gpt124m:16:c gpt124m:24:c 2>&1 | grep '^{' |
   tee -a "$out/bench.jsonl")
echo "elapsed ${SECONDS}s"
