# Sourced by the multi-GPU device scripts: model and batch (M, B), a time guard for starting
# new items (left [seconds]), the GPUs of the machine, then the 2- and 4-GPU tests.
M=${M:-gpt350m}; B=${B:-16}
left() { [ $SECONDS -lt ${1:-540} ]; }
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
timeout 150 .device/run forge_gpu_tests --gtest_filter='*DataParallel*:*Nccl*' 2>&1 |
  grep -E "^\[       OK|^\[  FAILED|PASSED|SKIPPED \]|Failure|error" | head -40
