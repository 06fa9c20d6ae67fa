#!/bin/bash
# On a 2-GPU machine: the GPU data-parallel resume tests (fsdp evaluates 3 batches on 2 ranks),
# then `forge train` on both GPUs through the local coordinator with metrics.port set, scraping
# rank 0's and rank 1's /metrics mid-run for the step series, MFU, GPU memory and NVML health.
set -u
cd "$(dirname "$0")/.."
timeout 120 .device/run forge_gpu_tests --gtest_filter='*GpuDataParallelResume*' 2>&1 | grep -E "^\[       OK|FAILED|PASSED|Failure" | head
export FORGE_DATA_DIR=/tmp/fd
mkdir -p $FORGE_DATA_DIR && tar -xJf .devdata/mini.tar.xz -C $FORGE_DATA_DIR
{ sed "s/every_steps: 250/every_steps: 100/" configs/gpt124m.yaml; printf 'metrics:\n  port: 9450\n  bind_address: 127.0.0.1\n'; } > /tmp/m.yaml
.device/run forge train /tmp/m.yaml --steps 300 --run-dir /tmp/run_m > /tmp/m.log 2>&1 &
python3 - <<'PY'
import time, urllib.request, re
want = ["forge_step", "forge_tokens_per_second", "forge_mfu_ratio", "forge_gpu_memory_bytes",
        "forge_gpu_utilization_ratio", "forge_gpu_power_watts", "forge_gpu_temperature_celsius",
        "forge_gpu_sm_clock_hertz", "forge_gpu_throttle_reason", "forge_comm_seconds_total"]
seen = {}
for _ in range(120):
    time.sleep(0.5)
    for port in (9450, 9451):
        try: text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except Exception: continue
        step = [float(l.split()[-1]) for l in text.splitlines() if l.startswith("forge_step{")]
        if step and max(step) >= 50: seen[port] = text
    if len(seen) == 2: break
for port, text in sorted(seen.items()):
    print(f"== rank on port {port}")
    for name in want:
        lines = [l for l in text.splitlines() if l.startswith(name + "{") or l.startswith(name + " ")]
        print(f"{name}: {len(lines)} series", (lines[0][:150] if lines else "MISSING"))
if len(seen) < 2: print("only scraped", sorted(seen))
PY
wait
tail -3 /tmp/m.log
