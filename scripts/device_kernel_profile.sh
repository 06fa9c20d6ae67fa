#!/bin/bash
# Where a training step's GPU time goes, kernel by kernel (one device call, one GPU):
# ncu times every kernel of the last eager step of forge-bench (FORGE_CUDA_GRAPH=0, one
# stream), caches and clocks left alone, so each kernel's time is as close to the real step's
# as a serialised replay gets; then nvidia-smi samples clocks and power while the same model
# runs graph-replayed, which shows whether the real step runs at lower clocks than the
# serialised one. scripts/kernel_profile_summary.py $OUT/ncu_PRECISION.log groups the CSV (in the .log) by kernel family.
# Expects .device/ with forge-bench. Env: MODEL (gpt350m), B (16), PRECISIONS ("bf16 fp8"),
# FLAGS (more forge-bench flags, e.g. "--fp8-lm-head 1"), TAG (appended to the file names),
# STEPS (the graph-replayed run's steps, 200).
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
M=${MODEL:-gpt350m}; B=${B:-16}
for p in ${PRECISIONS:-bf16 fp8}; do
  f=$p${TAG:-}
  FORGE_CUDA_GRAPH=0 timeout 240 .device/run ncu --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum --csv --page raw --log-file "$out/ncu_$f.log" \
    forge-bench --config configs/$M.yaml --micro-batch $B --warmup 1 --steps 1 --precision $p \
    ${FLAGS:-} > "$out/ncu_$f.csv" 2> "$out/ncu_$f.err"
  echo "ncu $f: rc $? $(wc -l < "$out/ncu_$f.csv") lines"
  (nvidia-smi dmon -s pc -d 1 > "$out/dmon_$f.txt" 2>&1 &)
  .device/run forge-bench --config configs/$M.yaml --micro-batch $B --steps ${STEPS:-200} \
    --precision $p ${FLAGS:-} 2>&1 | grep '^{' | tee -a "$out/bench.jsonl"
  pkill -f "nvidia-smi dmon" || true
done
