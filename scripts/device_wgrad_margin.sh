#!/bin/bash
# Weight-gradient GEMMs leaving SMs to the chain's bandwidth-bound kernels (one GPU, one device
# call): forge-bench gpt350m --steps 30 with FORGE_WGRAD_SM_MARGIN from MARGINS (default
# "0 16 32 48") in BF16 at B 16, then MARGINS2 (default "0 32") in FP8 + FP8 LM head at B 16
# (SKIP_FP8=1 leaves it out) and in BF16 at B 24,
# alternated, ROUNDS rounds (default 2). JSON lines in $OUT/bench.jsonl (label
# <precision>-b<B>-m<margin>), a summary line per run.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
for r in ${ROUNDS:-1 2}; do
  for m in ${MARGINS:-0 16 32 48}; do
    FORGE_WGRAD_SM_MARGIN=$m B=16 bench "bf16-b16-m$m" forge-bench --precision bf16
  done
  for m in ${MARGINS2:-0 32}; do
    [ -n "${SKIP_FP8:-}" ] ||
      FORGE_WGRAD_SM_MARGIN=$m B=16 bench "fp8lm-b16-m$m" forge-bench --precision fp8 --fp8-lm-head 1
    FORGE_WGRAD_SM_MARGIN=$m B=24 bench "bf16-b24-m$m" forge-bench --precision bf16
  done
done
echo "elapsed ${SECONDS}s"
