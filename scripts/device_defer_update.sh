#!/bin/bash
# The deferred AdamW (one GPU, one device call): the deferred-update and model tests first
# (SKIP_SUITE=1 leaves them out), then forge-bench gpt350m --steps 30 with the update at the
# end of the step (FORGE_CUDA_DEFER_UPDATE=0, label "off") and deferred ("on"), in BF16 at
# B 16 and 24 and FP8 + FP8 LM head at B 16, alternated, ROUNDS rounds (default 2); then
# (TORCH=1, the default) the compiled PyTorch anchor at B 16 and 24. JSON lines in
# $OUT/bench.jsonl (PyTorch's in $OUT/torch.jsonl).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
[ -n "${SKIP_SUITE:-}" ] ||
  SUITE_S=200 suite --gtest_filter='*Deferred*:GpuModel.*:*AdamW*:*Adam*'
run2() {  # label-prefix B [forge-bench flags]
  local p=$1 b=$2
  shift 2
  FORGE_CUDA_DEFER_UPDATE=0 B=$b bench "$p-off" forge-bench "$@"
  B=$b bench "$p-on" forge-bench "$@"
}
for r in ${ROUNDS:-1 2}; do
  run2 bf16-b16 16 --precision bf16
  run2 bf16-b24 24 --precision bf16
  run2 fp8lm-b16 16 --precision fp8 --fp8-lm-head 1
done
if [ "${TORCH:-1}" = 1 ]; then
  py=python3
  /opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
  (cd .device && PYTHONUNBUFFERED=1 timeout 240 $py torch_baseline.py gpt350m:16:c gpt350m:24:c \
     2>&1 | grep '^{' | tee -a "$out/torch.jsonl")
fi
echo "elapsed ${SECONDS}s"
