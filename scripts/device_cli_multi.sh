#!/bin/bash
# `forge train` on 2 GPUs of one machine, torchrun-style (RANK / WORLD_SIZE / LOCAL_RANK /
# MASTER_ADDR / MASTER_PORT; no MPI): gpt124m on the small real dataset (.devdata/mini.tar.xz)
# in ddp and fsdp. Each mode: 60 steps with a checkpoint at 30, then a second run stopped at
# 30 and resumed to 60 (the records of steps 31-60 must be identical), then the fsdp
# checkpoint resumed on ONE GPU (resharding 2 -> 1). PRECISION=fp8 runs it all in FP8 (the
# checkpoints then carry the FP8 scaling state); MODES picks the modes (default "ddp fsdp").
set -u
PRECISION=${PRECISION:-bf16}
cd "$(dirname "$0")/.."
export FORGE_DATA_DIR=/tmp/fd
mkdir -p $FORGE_DATA_DIR && tar -xJf .devdata/mini.tar.xz -C $FORGE_DATA_DIR
port=29611
launch() {  # launch CONFIG RUN_DIR ARGS...
  local cfg=$1 dir=$2; shift 2; port=$((port + 1))
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      .device/run forge train $cfg --run-dir $dir "$@" > $dir.rank$r.log 2>&1 &
  done
  wait
  grep -E "forge: (training|done|stopped)|error|Error" $dir.rank0.log | head -5
}
for mode in ${MODES:-ddp fsdp}; do
  sed "s/^  mode: ddp /  mode: $mode /; s/every_steps: 250/every_steps: 30/; s/compute: bf16/compute: $PRECISION/" \
    configs/gpt124m.yaml > /tmp/$mode.yaml
  echo "== $mode: 60 steps, checkpoint every 30"
  launch /tmp/$mode.yaml /tmp/run_$mode --steps 60 --checkpoint-every 30
  echo "== $mode: 30 steps, then resumed to 60"
  launch /tmp/$mode.yaml /tmp/resume_$mode --steps 30 --checkpoint-every 30
  launch /tmp/$mode.yaml /tmp/resume_$mode --steps 60 --checkpoint-every 30 --resume latest
  python3 - $mode <<'PY'
import json, sys
m = sys.argv[1]
def recs(d):
    return {r["step"]: (r["loss"], r["grad_norm"], r.get("val_loss")) for r in map(json.loads, open(f"/tmp/{d}/metrics.jsonl")) if r["step"] > 30}
a, b = recs(f"run_{m}"), recs(f"resume_{m}")
print(m, "steps compared", sorted(a)[:1], "..", sorted(a)[-1:], "identical" if a == b and a else "DIFFER", a.get(60), b.get(60))
PY
done
echo "== fsdp step_30 checkpoint (2 GPUs) resumed on 1 GPU"
.device/run forge train /tmp/fsdp.yaml --direct --run-dir /tmp/one_gpu --steps 60 --resume /tmp/run_fsdp/checkpoints/step_30 2>&1 | grep -E "forge: |rror" | tail -3
python3 -c "
import json
a={r['step']:r['loss'] for r in map(json.loads,open('/tmp/run_fsdp/metrics.jsonl'))}
b={r['step']:r['loss'] for r in map(json.loads,open('/tmp/one_gpu/metrics.jsonl'))}
print('2 GPUs vs 1 GPU after resharding, loss at', [(s, a.get(s), b.get(s)) for s in (40, 50, 60)])"
