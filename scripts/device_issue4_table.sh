#!/bin/bash
# Issue 4's table in ONE device call on one GPU (~8 min): forge-bench gpt350m (--steps 30, CUDA
# graph replay) at micro-batch SIZES (default "16 24"): BF16, FP8 + FP8 LM head with
# precision.fp8.fast_accum fprop_dgrad (the default since session 20), fprop and none, and FP8 without the LM
# head (default fast_accum); then the compiled PyTorch anchor (torch_baseline.py MODEL:B:c) at
# the same batches on the same GPU; then, with ACC=1 and time left, gpt124m's 2000-step BF16
# accuracy run (scripts/device_fp8_accuracy.sh) as the same-code reference curve. JSON lines
# in $OUT/bench.jsonl (labels <precision>[-<fast_accum>]-b<B>), metrics in $OUT/bf16.jsonl.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
for b in ${SIZES:-16 24}; do
  B=$b bench "bf16-b$b" forge-bench --precision bf16
  for f in fprop_dgrad fprop none; do
    B=$b bench "fp8lm-$f-b$b" forge-bench --precision fp8 --fp8-lm-head 1 --fp8-fast-accum $f
  done
  B=$b bench "fp8-default-b$b" forge-bench --precision fp8 --fp8-lm-head 0
done
echo "forge done at ${SECONDS}s"
shapes=""
for b in ${SIZES:-16 24}; do shapes="$shapes gpt350m:$b:c"; done
anchor $((520 - SECONDS)) $shapes
echo "anchor done at ${SECONDS}s"
if [ "${ACC:-0}" = 1 ] && [ "$SECONDS" -lt 440 ]; then
  source scripts/device_fp8_accuracy.sh
  acc_config bf16 bf16 false
  acc_run bf16
fi
echo "elapsed ${SECONDS}s"
