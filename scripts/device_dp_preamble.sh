# Sourced by the multi-GPU device scripts: model and batch (M, B), a time guard for starting
# new items (left [seconds]), `run MODE [ENV=VALUE ...]` (forge-dist-bench on W GPUs, default 4,
# with that environment and $EXTRA flags, its JSON line prefixed with the settings), the GPUs
# of the machine, then the 2- and 4-GPU tests (TESTS: another gtest filter, TESTS_S: their time limit, default 240 s).
M=${M:-gpt350m}; B=${B:-16}; W=${W:-4}
left() { [ $SECONDS -lt ${1:-540} ]; }
run() {
  local mode=$1; shift
  left && timeout 100 env "$@" .device/run forge-dist-bench --config configs/$M.yaml --world $W \
    --mode $mode --micro-batch $B --steps 20 ${EXTRA:-} 2>&1 | grep '^{' | sed "s/^/$mode $* /"
}
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
timeout ${TESTS_S:-240} .device/run forge_gpu_tests --gtest_filter="${TESTS:-*DataParallel*:*Nccl*:CopyEngine*}" 2>&1 |
  grep -E "^\[       OK|^\[  FAILED|PASSED|SKIPPED \]|Failure|error" | head -40
