#!/bin/bash
# One GPU, one call: the whole single-GPU test suite (multi-GPU cases skip themselves), then
# forge-bench gpt350m B ${B:-16}: BF16 once, FP8 + FP8 LM head with fast accumulation none /
# fprop / fprop_dgrad (ROUNDS rounds, alternated). Results under $OUT (suite.txt, bench.jsonl).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
B=${B:-16}
[ -n "${SKIP_SUITE:-}" ] || suite --gtest_brief=1 ${FILTER:+--gtest_filter=$FILTER}
bench() {  # label, forge-bench flags
  local label=$1; shift
  timeout 60 .device/run forge-bench --config configs/gpt350m.yaml --micro-batch $B --steps 30 "$@" 2>&1 |
    grep '^{' | sed "s/^/{\"label\":\"$label\",/; s/,{/,/" | tee -a "$out/bench.jsonl" |
    sed -E 's/.*"label":"([^"]*)".*"step_ms":([0-9.]+),"tokens_per_s":([0-9.]+).*/\1 step_ms \2 tok\/s \3/'
}
bench bf16 --precision bf16
for r in ${ROUNDS:-1 2}; do
  for f in none fprop fprop_dgrad; do bench fp8lm-$f --precision fp8 --fp8-lm-head 1 --fp8-fast-accum $f; done
done
echo "elapsed ${SECONDS}s"
