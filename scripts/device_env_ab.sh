#!/bin/bash
# A/B of one environment switch of the CUDA backend on one GPU in one device call:
#   VAR=FORGE_CUDA_EMB_PENDING scripts/device_env_ab.sh
# The whole single-GPU suite first (SKIP_SUITE skips it), then forge-bench gpt350m BF16 at
# micro-batch SIZES (default "16 24") and FP8 + FP8 LM head at B 16 (FP8=0 leaves it out), with
# $VAR=0 and =1 alternated (VALUES="8 32": those values instead), ROUNDS rounds (default 2).
# JSON lines in $OUT/bench.jsonl, labelled <precision>-b<B>-<VAR>=<value>.
set -u
cd "$(dirname "$0")/.."
: "${VAR:?name the switch: VAR=FORGE_CUDA_...}"
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || SUITE_S=300 suite
for r in ${ROUNDS:-1 2}; do
  for b in ${SIZES:-16 24}; do
    for x in ${VALUES:-0 1}; do
      export "$VAR=$x"
      B=$b bench "bf16-b$b-$VAR=$x" forge-bench --precision bf16
    done
  done
  [ "${FP8:-1}" = 0 ] && continue
  for x in ${VALUES:-0 1}; do
    export "$VAR=$x"
    bench "fp8lm-b16-$VAR=$x" forge-bench --precision fp8 --fp8-lm-head 1
  done
done
echo "elapsed ${SECONDS}s"
