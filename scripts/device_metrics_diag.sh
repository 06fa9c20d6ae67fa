python3 -c "
import socket
for p in (9450, 18450):
    s=socket.socket(); 
    try: s.bind(('127.0.0.1',p)); print('bind',p,'ok')
    except Exception as e: print('bind',p,e)
    s.close()"
export FORGE_DATA_DIR=/tmp/fd; mkdir -p /tmp/fd && tar -xJf .devdata/mini.tar.xz -C /tmp/fd
{ sed "s/every_steps: 250/every_steps: 100/" configs/gpt124m.yaml; printf 'metrics:\n  port: 18450\n  bind_address: 127.0.0.1\n'; } > /tmp/m.yaml
CUDA_VISIBLE_DEVICES=0 timeout 40 .device/run forge train /tmp/m.yaml --direct --steps 150 --run-dir /tmp/r1 > /tmp/r1.log 2>&1 &
sleep 14; python3 -c "
import urllib.request
t=urllib.request.urlopen('http://127.0.0.1:18450/metrics',timeout=3).read().decode()
for n in ['forge_step{','forge_mfu_ratio','forge_gpu_memory_bytes','forge_gpu_utilization_ratio','forge_gpu_power_watts','forge_gpu_temperature_celsius','forge_gpu_sm_clock_hertz','forge_gpu_throttle_reason']:
    l=[x for x in t.splitlines() if x.startswith(n)]; print(n, len(l), l[0][:140] if l else 'MISSING')" 2>&1 | tail -12
wait; tail -2 /tmp/r1.log
