#!/bin/bash
# A/B of two builds on one GPU in one device call: the GPU tests of the new build (FILTER, default
# every test; multi-GPU ones skip on one GPU; SKIP_SUITE=1 leaves them out), then forge-bench gpt350m B ${B:-16} --steps 30 with
# the base build (.device/bin/forge-bench-base: copy the other build's forge-bench there before
# packing) and the new one (.device/bin/forge-bench), alternated, ROUNDS rounds, for each of
# PRECISIONS (bf16, fp8, fp8lm = FP8 with the FP8 LM head). One JSON line per run in
# $OUT/bench.jsonl (label build/precision), a summary line per run on stdout.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || suite --gtest_brief=1 ${FILTER:+--gtest_filter=$FILTER}
flags() {
  case $1 in
    bf16) echo "--precision bf16" ;;
    fp8) echo "--precision fp8 --fp8-lm-head 0" ;;
    fp8lm) echo "--precision fp8 --fp8-lm-head 1" ;;
  esac
}
for r in ${ROUNDS:-1 2}; do
  for p in ${PRECISIONS:-bf16 fp8 fp8lm}; do
    # shellcheck disable=SC2046
    for bin in forge-bench-base forge-bench; do bench "$bin/$p" $bin $(flags $p); done
  done
done
echo "elapsed ${SECONDS}s"
