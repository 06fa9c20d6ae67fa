#!/bin/bash
# One GPU, one call: the whole single-GPU test suite (multi-GPU cases skip themselves), then
# forge-bench gpt350m B ${B:-16}: BF16 once, FP8 + FP8 LM head with fast accumulation none /
# fprop / fprop_dgrad (ROUNDS rounds, alternated). Results under $OUT (suite.txt, bench.jsonl).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || suite --gtest_brief=1 ${FILTER:+--gtest_filter=$FILTER}
bench bf16 forge-bench --precision bf16
for r in ${ROUNDS:-1 2}; do
  for f in none fprop fprop_dgrad; do bench fp8lm-$f forge-bench --precision fp8 --fp8-lm-head 1 --fp8-fast-accum $f; done
done
echo "elapsed ${SECONDS}s"
