# Sourced by the one-GPU device scripts, after they cd to the repo root: $out ($OUT, made), the
# GPU's name, max SM clock and power limit, `suite [gtest flags]`: forge_gpu_tests under a
# time limit (SUITE_S, default 300 s) into $out/suite.txt, its exit code and summary printed,
# and `bench LABEL BINARY [forge-bench flags]`: gpt350m at micro-batch ${B:-16}, 30 steps, with
# BINARY (forge-bench, or an A/B's forge-bench-base); its JSON line tagged "label" appended to
# $out/bench.jsonl and a summary line printed (variables set on the call reach forge-bench), and
# `hard SECONDS COMMAND...` (below), and `anchor SECONDS SHAPE...`: the PyTorch anchor
# (torch_baseline.py, copied into .device/) on the same GPU, its JSON lines appended to
# $out/bench.jsonl.
# (The multi-GPU scripts source device_dp_preamble.sh instead.)
out=${OUT:-/tmp/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
# `hard SECONDS COMMAND...`: kills a timed-out run outright, then waits (up to 60 s) until no
# process is left on the GPU, so a hung kernel cannot stall the rest of the call (session 17: a
# suite killed by a plain timeout left the GPU busy and every bench after it hung).
hard() {
  local s=$1
  shift
  timeout -s KILL "$s" "$@"
  local rc=$?
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader)" ] && break
    sleep 1
  done
  return $rc
}
suite() {
  hard ${SUITE_S:-300} .device/run forge_gpu_tests "$@" > "$out/suite.txt" 2>&1
  echo "suite rc $?"
  grep -E "^\[  FAILED|PASSED|SKIPPED \]|tests ran|Failure" "$out/suite.txt" | head -30
}
bench() {
  local label=$1 bin=$2
  shift 2
  hard ${BENCH_S:-90} .device/run "$bin" --config configs/gpt350m.yaml --micro-batch "${B:-16}" \
    --steps 30 "$@" 2>&1 | grep '^{' | sed "s|^{|{\"label\":\"$label\",|" |
    tee -a "$out/bench.jsonl" |
    sed -E 's/.*"label":"([^"]*)".*"step_ms":([0-9.]+),"tokens_per_s":([0-9.]+).*/\1 step_ms \2 tok\/s \3/'
}
anchor() {
  local s=$1
  shift
  local py=python3
  /opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
  (cd .device && PYTHONUNBUFFERED=1 hard "$s" $py torch_baseline.py "$@" 2>&1 |
     grep '^{' | tee -a "$out/bench.jsonl" | cut -c1-300)
}
