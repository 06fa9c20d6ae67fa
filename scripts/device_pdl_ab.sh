#!/bin/bash
# Programmatic dependent launch on one GPU in one device call: the GPU suite (FILTER, default
# all; SKIP_SUITE=1 leaves it out), then forge-bench gpt350m --steps 30 at micro-batch BS
# (default "16 24") in BF16 and in FP8 with the FP8 LM head, FORGE_CUDA_PDL=0 and =1
# alternated, ROUNDS rounds (default 2); then the compiled PyTorch anchor at the same
# micro-batches (SKIP_TORCH=1 leaves it out). JSON lines in $OUT/bench.jsonl (label
# pdl<0|1>-<precision>-b<B>), a summary line per run.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] || suite --gtest_brief=1 ${FILTER:+--gtest_filter=$FILTER}
for r in ${ROUNDS:-1 2}; do
  for B in ${BS:-16 24}; do
    for pdl in 0 1; do
      FORGE_CUDA_PDL=$pdl B=$B bench "pdl$pdl-bf16-b$B" forge-bench --precision bf16
      FORGE_CUDA_PDL=$pdl B=$B bench "pdl$pdl-fp8lm-b$B" forge-bench --precision fp8 --fp8-lm-head 1
    done
  done
done
if [ -z "${SKIP_TORCH:-}" ]; then
  py=python3
  /opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
  args=$(for B in ${BS:-16 24}; do printf 'gpt350m:%s:c ' $B; done)
  (cd .device && PYTHONUNBUFFERED=1 timeout 200 $py torch_baseline.py $args 2>&1 | grep '^{' |
     tee -a "$out/bench.jsonl")
fi
echo "elapsed ${SECONDS}s"
