#!/bin/bash
# LM-head chunk rows (FORGE_CUDA_LM_HEAD_CHUNK) and the deferred AdamW (FORGE_CUDA_DEFER_UPDATE)
# at gpt350m BF16 (one GPU, one device call): forge-bench --steps 30 at B 16 with chunks from
# CHUNKS16 (default "4096 8192 16384") and at B 24 with CHUNKS24 (default "4096 8192 12288"),
# the update deferred (label d1-c<rows>) and, at 4096 rows, also at the step's end (d0-c4096);
# alternated, ROUNDS rounds (default 2). JSON lines in $OUT/bench.jsonl.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
for r in ${ROUNDS:-1 2}; do
  for B in 16 24; do
    FORGE_CUDA_DEFER_UPDATE=0 B=$B bench "b$B-d0-c4096" forge-bench --precision bf16
    chunks=${CHUNKS16:-4096 8192 16384}
    [ $B = 24 ] && chunks=${CHUNKS24:-4096 8192 12288}
    for c in $chunks; do
      FORGE_CUDA_LM_HEAD_CHUNK=$c B=$B bench "b$B-d1-c$c" forge-bench --precision bf16
    done
  done
done
echo "elapsed ${SECONDS}s"
