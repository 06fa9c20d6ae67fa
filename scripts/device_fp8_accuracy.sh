# Sourced by the FP8 device scripts: the accuracy runs on the real corpus (.devdata/full.tar.xz,
# unpacked into $FORGE_DATA_DIR). acc_config NAME COMPUTE LM_HEAD [FAST_ACCUM] writes
# /tmp/acc_NAME.yaml, gpt124m with validation every 100 steps, global batch 16, STEPS steps;
# acc_run NAME trains it and copies its metrics to $out/NAME.jsonl.
STEPS=${STEPS:-2000}
export FORGE_DATA_DIR=/tmp/fd
mkdir -p $FORGE_DATA_DIR && tar -xJf .devdata/full.tar.xz -C $FORGE_DATA_DIR
acc_config() {
  sed -e "s/compute: bf16/compute: $2\n  fp8:\n    lm_head: $3\n    fast_accum: ${4:-none}/" \
      -e "s/every_steps: 250/every_steps: 100/" -e "s/global_batch: 32/global_batch: 16/" \
      -e "s/total_steps: 2000/total_steps: $STEPS/" configs/gpt124m.yaml > /tmp/acc_$1.yaml
}
acc_run() {
  timeout 200 .device/run forge train /tmp/acc_$1.yaml --direct --checkpoint-every 0 \
    --run-dir /tmp/acc_$1 > /tmp/acc_$1.log 2>&1
  cp /tmp/acc_$1/metrics.jsonl "$out/$1.jsonl" 2>/dev/null
  echo "== $1"; grep -E "val loss|skipped|warning|error" /tmp/acc_$1.log | tail -4; tail -1 /tmp/acc_$1.log
}
