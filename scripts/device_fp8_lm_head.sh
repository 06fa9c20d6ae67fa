#!/bin/bash
# precision.fp8.lm_head in ONE device call (one GPU): the whole GPU suite, forge-bench FP8 with
# the LM head in BF16 and in FP8 (gpt350m B 16 twice each, alternated; gpt124m B 16), then the
# accuracy runs on the real corpus (.devdata/full.tar.xz): gpt124m from the same init and data
# for STEPS steps in BF16, FP8 and FP8 + LM head, validation every 100. Results under $OUT:
# suite.txt, bench.jsonl, {bf16,fp8,fp8lm}.jsonl (the runs' metrics).
set -u
cd "$(dirname "$0")/.."
source scripts/device_gpu_preamble.sh
timeout 300 .device/run forge_gpu_tests > "$out/suite.txt" 2>&1
grep -E "^\[  FAILED|PASSED|SKIPPED \]|tests ran|Failure|worst" "$out/suite.txt" | grep -v "SKIPPED \] Modes\|SKIPPED \] Nccl" | head -40
bench() {  # config lm_head
  .device/run forge-bench --config configs/$1.yaml --micro-batch 16 --steps 30 --precision fp8 \
    --fp8-lm-head $2 2>&1 | grep '^{' | tee -a "$out/bench.jsonl" |
    sed -E 's/.*"step_ms":([0-9.]+),"tokens_per_s":([0-9.]+).*"peak_mem_gib":([0-9.]+).*"fp8_lm_head":([a-z]+).*"loss":([0-9.]+).*/step_ms \1 tok\/s \2 GiB \3 lm_head \4 loss \5/'
}
for rep in 1 2; do bench gpt350m 0; bench gpt350m 1; done
bench gpt124m 0; bench gpt124m 1

source scripts/device_fp8_accuracy.sh
acc_config bf16 bf16 false; acc_config fp8 fp8 false; acc_config fp8lm fp8 true
grep -A3 "^precision" /tmp/acc_fp8lm.yaml
for p in ${ACC:-bf16 fp8 fp8lm}; do acc_run $p; done  # ACC="fp8lm": only the FP8 LM head's run
echo "elapsed ${SECONDS}s"
