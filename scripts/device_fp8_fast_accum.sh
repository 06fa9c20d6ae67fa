#!/bin/bash
# precision.fp8.fast_accum in ONE device call (one GPU): the FP8 tests (SKIP_SUITE=1 leaves
# them out), forge-bench FP8 + FP8 LM head with fast accumulation none / fprop / fprop_dgrad
# (gpt350m B 16 twice each, alternated; B 24 and gpt124m B 16 once), then the accuracy runs on the real
# corpus (.devdata/full.tar.xz): gpt124m from the same init and data as session 5's runs for
# STEPS steps, validation every 100 (ACC: which runs, default fprop and fprop_dgrad;
# session 5's BF16 and FP8 + LM head curves are in docs/benchmarks.md). Results under $OUT.
# Benches (~5 min) and both accuracy runs (~7 min) do not fit one 10-minute call: ACC="" first.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || SUITE_S=200 suite --gtest_filter='*Fp8*:*fp8*:GpuGemm*'
bench() {  # config micro-batch fast_accum
  .device/run forge-bench --config configs/$1.yaml --micro-batch $2 --steps 30 --precision fp8 \
    --fp8-lm-head 1 --fp8-fast-accum $3 2>&1 | grep '^{' | tee -a "$out/bench.jsonl" |
    sed -E 's/.*"step_ms":([0-9.]+),"tokens_per_s":([0-9.]+).*"loss":([0-9.]+).*/step_ms \1 tok\/s \2 loss \3/' |
    sed "s/^/$1 B$2 fast=$3 /"
}
for rep in 1 2; do for f in none fprop fprop_dgrad; do bench gpt350m 16 $f; done; done
for f in none fprop fprop_dgrad; do bench gpt350m 24 $f; bench gpt124m 16 $f; done

[ -n "${ACC-x}" ] || { echo "elapsed ${SECONDS}s"; exit 0; }  # ACC="": benches only
source scripts/device_fp8_accuracy.sh
acc_config fp8lm fp8 true none; acc_config fp8lmfast fp8 true fprop
acc_config fp8lmfastd fp8 true fprop_dgrad
grep -A4 "^precision" /tmp/acc_fp8lmfast.yaml
for p in ${ACC-fp8lmfast fp8lmfastd}; do acc_run $p; done
echo "elapsed ${SECONDS}s"
