#!/bin/bash
# Issue 3's table with Forge trained both ways, in ONE device call on one GPU (~8 min): forge-bench
# BF16 with the config's recipe (GPT-2 initialisation, the config's AdamW) and with
# --recipe torch (the anchor's: PyTorch's default initialisation and AdamW, no clipping), the two
# alternated, gpt350m at micro-batch 8, 16, 24 and gpt124m at 16, then gpt350m 16 and 24 again;
# then the compiled PyTorch anchor for the same shapes, on the same GPU. Same FLOPs and kernels
# in both recipes: the step is power-limited and its speed depends on the values it multiplies
# (scripts/device_regime.sh). JSON lines in $OUT/bench.jsonl (label <model>-b<B>-<recipe>).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
one() {  # model:B recipe
  .device/run forge-bench --config configs/${1%%:*}.yaml --micro-batch ${1##*:} --steps 30 \
    --precision bf16 --recipe $2 2>&1 | grep '^{' |
    sed "s|^{|{\"label\":\"${1%%:*}-b${1##*:}-$2\",|" | tee -a "$out/bench.jsonl" |
    sed -E 's/.*"label":"([^"]*)".*"step_ms":([0-9.]+),"tokens_per_s":([0-9.]+).*"loss":([0-9.e+-]+).*/\1 step_ms \2 tok\/s \3 loss \4/'
}
for mb in gpt350m:8 gpt350m:16 gpt350m:24 gpt124m:16 gpt350m:16 gpt350m:24; do
  for rec in config torch; do one $mb $rec; done
done
echo "forge done at ${SECONDS}s"
anchor 300 gpt350m:8:c gpt350m:16:c gpt350m:24:c gpt124m:16:c
echo "elapsed ${SECONDS}s"
