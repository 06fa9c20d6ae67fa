#!/bin/bash
# One 4-GPU device call (~8 min): the multi-GPU tests (device_dp_preamble.sh: ddp / zero / fsdp
# against one GPU, FP8 included, NCCL, copy engines), then the distinct-batch question
# (forge-dist-bench gpt350m B 16 ddp on 4 GPUs with --distinct-batches --accum-check: each
# rank's own-batch loss and one GPU trained on the ranks' batches as accumulated micro-batches;
# then ddp with one batch everywhere), then issue 5's ddp efficiency again (NCCL all-reduce with
# fp32 and with bf16 gradients, each beside its own single-GPU baseline). JSON lines in
# $OUT/dist.jsonl.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
source scripts/device_dp_preamble.sh
keys='"mode":"[a-z0-9]*"\|"world":[0-9]*\|"scaling_efficiency":[0-9.e+-]*\|"tokens_per_s_per_gpu":[0-9.]*\|"single_gpu_tokens_per_s":[0-9.]*\|"loss":[0-9.e+-]*\|"single_gpu_loss":[0-9.e+-]*\|"rank_[a-z_]*":\[[^]]*\]\|"accum_[a-z_]*":[^,]*\(,[0-9.e+-]*\)*\]\?\|"error":.*'
one() {  # label [forge-dist-bench flags]
  local label=$1
  shift
  left 560 && timeout 150 .device/run forge-dist-bench --config configs/gpt350m.yaml --world 4 \
    --micro-batch 16 --steps 20 "$@" 2>&1 | grep '^{' | sed "s|^{|{\"label\":\"$label\",|" |
    tee -a "$out/dist.jsonl" | grep -o "$keys" | tr '\n' ' '
  echo " [$label]"
}
one distinct --mode ddp --distinct-batches --accum-check
[ -n "${SAME:-}" ] && one same --mode ddp
one ddp-fp32 --mode ddp
one ddp-bf16 --mode ddp --grad-reduce bf16
echo "elapsed ${SECONDS}s"
