# Sourced by the one-GPU device scripts, after they cd to the repo root: $out ($OUT, made), the
# GPU's name, max SM clock and power limit, and `suite [gtest flags]`: forge_gpu_tests under a
# time limit (SUITE_S, default 300 s) into $out/suite.txt, its exit code and summary printed.
# (The multi-GPU scripts source device_dp_preamble.sh instead.)
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
suite() {
  timeout ${SUITE_S:-300} .device/run forge_gpu_tests "$@" > "$out/suite.txt" 2>&1
  echo "suite rc $?"
  grep -E "^\[  FAILED|PASSED|SKIPPED \]|tests ran|Failure" "$out/suite.txt" | head -30
}
