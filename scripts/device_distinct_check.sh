#!/bin/bash
# The distinct-batch loss question (sessions 10-14) in one device call on a 4-GPU machine (~3
# min): forge-dist-bench gpt350m B 16 --steps 20 ddp on 4 and 2 GPUs with --distinct-batches
# --accum-check (every rank's own-batch loss, and one GPU trained on the ranks' batches as
# accumulated micro-batches: the step's exact job), fsdp on 4 likewise, then ddp on 4 with one
# batch everywhere for reference. JSON lines in $OUT/dist.jsonl.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
one() {  # world mode [flags]
  local w=$1 m=$2
  shift 2
  timeout 150 .device/run forge-dist-bench --config configs/gpt350m.yaml --world $w --mode $m \
    --micro-batch 16 --steps 20 "$@" 2>&1 | grep '^{' | tee -a "$out/dist.jsonl" |
    grep -o '"mode":"[a-z0-9]*"\|"world":[0-9]*\|"loss":[0-9.e+-]*\|"single_gpu_loss":[0-9.e+-]*\|"rank_[a-z_]*":\[[^]]*\]\|"accum_[a-z_]*":[^,]*\(,[0-9.e+-]*\)*\]\?\|"error":.*' |
    tr '\n' ' '
  echo
}
one 4 ddp --distinct-batches --accum-check
one 2 ddp --distinct-batches --accum-check
one 4 fsdp --distinct-batches --accum-check
one 4 ddp
echo "elapsed ${SECONDS}s"
