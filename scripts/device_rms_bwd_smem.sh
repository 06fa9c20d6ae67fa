#!/bin/bash
# EXPERIMENT (session 11): the RMSNorm backward with its dw accumulators in shared memory
# (SMEM_DW: 79 registers, three blocks an SM) against the register form (121, two blocks),
# FORGE_RMS_BWD_SMEM=1 / 0, one GPU, one call: the RMSNorm and model tests with it on, the
# kernel's ncu time in an eager gpt350m B 16 step both ways, then forge-bench BF16 B 16 and 24
# off / on alternated (device_env_ab.sh, no suite, no FP8: the FP8 kernel is unchanged).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
FORGE_RMS_BWD_SMEM=1 SUITE_S=200 suite \
  --gtest_filter='GpuRmsNorm*:GpuModel.*Bitwise*:GpuModel.GradientsMatchCpu:GpuModel.AccumulatedGradientsMatchCpu'
for x in 0 1; do
  FORGE_RMS_BWD_SMEM=$x FORGE_CUDA_GRAPH=0 timeout 120 .device/run ncu --clock-control none \
    --kernel-name regex:RmsNormBackwardKernel --launch-skip 48 --launch-count 8 \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
    --csv --page raw forge-bench --config configs/gpt350m.yaml --micro-batch 16 --warmup 1 \
    --steps 1 --precision bf16 > "$out/ncu_smem$x.csv" 2> "$out/ncu_smem$x.err"
  echo "ncu smem=$x rc $?"
  python3 - "$out/ncu_smem$x.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
if not rows: print("no ncu rows"); sys.exit()
h = rows[0]
idx = {k: h.index(k) for k in h if k.startswith(("gpu__time", "dram__", "sm__warps"))}
for r in rows[2:]:
    print(" ".join(f"{k.split('.')[0]}={r[i]}" for k, i in idx.items()))
PY
done
SKIP_SUITE=1 FP8=0 VAR=FORGE_RMS_BWD_SMEM scripts/device_env_ab.sh
