#!/bin/bash
# A/B of two builds on one GPU in one device call: the GPU tests of the new build (FILTER, default
# every test; multi-GPU ones skip on one GPU; SKIP_SUITE=1 leaves them out), then forge-bench gpt350m B ${B:-16} --steps 30 with
# the base build (.device/bin/forge-bench-base: copy the other build's forge-bench there before
# packing) and the new one (.device/bin/forge-bench), alternated, ROUNDS rounds, for each of
# PRECISIONS (bf16, fp8, fp8lm = FP8 with the FP8 LM head). One JSON line per run in
# $OUT/ab.jsonl, a summary line per run on stdout.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
B=${B:-16}
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
    for bin in forge-bench-base forge-bench; do
      # shellcheck disable=SC2046
      timeout 90 .device/run $bin --config configs/gpt350m.yaml --micro-batch $B --steps 30 $(flags $p) \
        2>&1 | grep '^{' | sed "s/^{/{\"build\":\"$bin\",\"run\":\"$p\",/" | tee -a "$out/ab.jsonl" |
        sed -E 's/.*"build":"([^"]*)","run":"([^"]*)".*"step_ms":([0-9.]+),"tokens_per_s":([0-9.]+).*/\1 \2 step_ms \3 tok\/s \4/'
    done
  done
done
echo "elapsed ${SECONDS}s"
