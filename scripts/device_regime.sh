#!/bin/bash
# How much the single-GPU step's speed depends on the numbers it computes with (one GPU, one
# device call, ~4 min): the step is power-limited, and the ddp benchmark showed ~1.4% between a
# model memorising one batch and one training on four (session 13). forge-bench gpt350m BF16 at
# micro-batch ${B:-16}, ROUNDS rounds (default 2) of config variants made from
# configs/gpt350m.yaml: default; the anchor's optimizer (beta2 0.999, weight decay 0.01, no
# clipping, as torch_baseline.py's AdamW); frozen (lr 1e-12: the weights stay at their init);
# init_std 0.05 (larger weights). Same FLOPs in every variant: any difference is the data's.
# JSON lines in $OUT/bench.jsonl labelled regime-<variant>.
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
dir=$(mktemp -d)
base=configs/gpt350m.yaml
cp $base $dir/default.yaml
sed -e 's/^  beta2: .*/  beta2: 0.999/' -e 's/^  weight_decay: .*/  weight_decay: 0.01/' \
  -e 's/^  grad_clip: .*/  grad_clip: 0/' $base > $dir/anchor_opt.yaml
sed -e 's/^  lr: .*/  lr: 1.0e-12/' $base > $dir/frozen.yaml
sed -e 's/^  preset: gpt350m.*/  preset: gpt350m\n  init_std: 0.05/' $base > $dir/init05.yaml
for r in ${ROUNDS:-1 2}; do
  for v in ${VARIANTS:-default anchor_opt frozen init05}; do
    timeout 90 .device/run forge-bench --config $dir/$v.yaml --micro-batch "${B:-16}" --steps 30 \
      --precision bf16 2>&1 | grep '^{' | sed "s|^{|{\"label\":\"regime-$v\",|" |
      tee -a "$out/bench.jsonl" |
      sed -E 's/.*"label":"([^"]*)".*"step_ms":([0-9.]+),"tokens_per_s":([0-9.]+).*"loss":([0-9.e+-]+).*/\1 step_ms \2 tok\/s \3 loss \4/'
  done
done
echo "elapsed ${SECONDS}s"
