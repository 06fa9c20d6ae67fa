#!/bin/bash
# Two trims of the BF16 backward, A/B on one GPU in one device call: softmax_sum from our kernel
# as an input of cuDNN's backward graph (FORGE_CUDA_ATTN_OWN_SUM) and the RMSNorm dw reductions
# on the wgrad stream (FORGE_CUDA_NORM_DW_WGRAD). The whole single-GPU suite first (SKIP_SUITE
# skips it), then forge-sdpa-bench --only gpt350m (the "bwd-det-ownsum" line), then forge-bench
# gpt350m BF16 at B 16 and 24 with each trim off / on, alternated, ROUNDS rounds (default 2),
# and FP8 + FP8 LM head at B 16 off / both. JSON lines in $OUT/bench.jsonl and $OUT/sdpa.jsonl.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || SUITE_S=300 suite
timeout 200 .device/run forge-sdpa-bench --only gpt350m --no-tune 2>&1 | grep '^{' |
  tee "$out/sdpa.jsonl" | grep -E 'ownsum|summary' | cut -c1-600
for r in ${ROUNDS:-1 2}; do
  for b in 16 24; do
    for v in "0 0" "1 0" "0 1" "1 1"; do
      set -- $v
      FORGE_CUDA_ATTN_OWN_SUM=$1 FORGE_CUDA_NORM_DW_WGRAD=$2 B=$b \
        bench "bf16-b$b-own$1-dw$2" forge-bench --precision bf16
    done
  done
  for v in "0 0" "1 1"; do
    set -- $v
    FORGE_CUDA_ATTN_OWN_SUM=$1 FORGE_CUDA_NORM_DW_WGRAD=$2 \
      bench "fp8lm-b16-own$1-dw$2" forge-bench --precision fp8 --fp8-lm-head 1
  done
done
echo "elapsed ${SECONDS}s"
