#!/bin/bash
# Issue 4 in ONE device call (1 or 2 GPUs): the whole GPU suite, then the FP8 accuracy runs
# (gpt124m, real corpus .devdata/full.tar.xz, the same init and data in BF16 and in FP8 for
# STEPS steps, validation every 100; on two GPUs side by side, else one after the other), then
# the benchmarks: forge-bench BF16 and FP8 (gpt350m and gpt124m at B 16) and the compiled
# PyTorch anchor on the same GPU. Results under $OUT: suite.txt, {bf16,fp8}.jsonl (metrics of the
# runs), bench.jsonl.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
STEPS=${STEPS:-2000}
ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 300 .device/run forge_gpu_tests ${GTEST_FILTER:+--gtest_filter=$GTEST_FILTER} > "$out/suite.txt" 2>&1
grep -E "^\[  FAILED|PASSED|SKIPPED \]|tests ran|Failure|worst" "$out/suite.txt" | head -40

export FORGE_DATA_DIR=/tmp/fd
mkdir -p $FORGE_DATA_DIR && tar -xJf .devdata/full.tar.xz -C $FORGE_DATA_DIR
for p in bf16 fp8; do
  sed -e "s/compute: bf16/compute: $p/" -e "s/every_steps: 250/every_steps: 100/" \
      -e "s/global_batch: 32/global_batch: 16/" -e "s/total_steps: 2000/total_steps: $STEPS/" \
      configs/gpt124m.yaml > /tmp/acc_$p.yaml
done
run_acc() {  # precision gpu
  CUDA_VISIBLE_DEVICES=$2 timeout 420 .device/run forge train /tmp/acc_$1.yaml --direct \
    --checkpoint-every 0 --run-dir /tmp/acc_$1 > /tmp/acc_$1.log 2>&1
  cp /tmp/acc_$1/metrics.jsonl "$out/$1.jsonl" 2>/dev/null
}
if [ "$ngpu" -ge 2 ]; then run_acc bf16 0 & run_acc fp8 1; wait
else run_acc bf16 0; run_acc fp8 0; fi
for p in bf16 fp8; do echo "== $p"; grep -E "val loss|skipped|warning|error" /tmp/acc_$p.log | tail -25; tail -2 /tmp/acc_$p.log; done

for m in gpt350m gpt124m; do
  for p in bf16 fp8; do
    .device/run forge-bench --config configs/$m.yaml --micro-batch 16 --steps 30 --precision $p 2>&1 | grep '^{' | tee -a "$out/bench.jsonl"
  done
done
for p in bf16 fp8; do
  .device/run forge-bench --config configs/gpt350m.yaml --micro-batch 16 --precision $p --profile 2>&1 | grep '^{' | tee -a "$out/bench.jsonl"
done
py=python3
/opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
(cd .device && PYTHONUNBUFFERED=1 timeout 200 $py torch_baseline.py gpt350m:16:c gpt124m:16:c 2>&1 | grep '^{' | tee -a "$out/bench.jsonl")
