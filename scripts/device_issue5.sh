#!/bin/bash
# Issue 5's GPU evidence in one device call on a 4-GPU machine (stops starting new items after
# ~540 s): multi-GPU tests, forge-dist-bench for every mode on 4 and 2 GPUs beside the PyTorch
# DDP / FSDP2 anchor on the same GPUs, then `forge train` on 2 GPUs (scripts/device_cli_multi.sh;
# SKIP_CLI=1 leaves it out), then ddp (NCCL and copy engines), fsdp, zero1 and zero2 on 2 GPUs
# and PyTorch on one GPU as time allows. ddp runs twice on 4 GPUs: NCCL's all-reduce and the
# copy engines (parallel.ddp_allreduce), the candidate default for one host if it reaches the
# 97% NCCL does not (sessions 5-7). DDP_MARGINS="0 48" adds ddp on 4 GPUs with those
# weight-gradient SM margins. SKIP_CE=1 leaves the copy-engine lines out; ddp also runs with
# bf16 gradient collectives on 4 and 2 GPUs.
# Expects .device/ (forge, forge_gpu_tests, forge-dist-bench, the anchors) and .devdata/.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
py=python3; /opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null && py=/opt/torch/.venv/bin/python3
bench() {  # world mode [forge-dist-bench flags]
  local w=$1 m=$2; shift 2
  left && timeout 90 .device/run forge-dist-bench --config configs/$M.yaml --world $w --mode $m \
    --micro-batch $B --steps 20 "$@" 2>&1 | grep '^{'
}
torch() { left ${3:-540} && (cd .device && timeout 150 $py -m torch.distributed.run --standalone --nproc_per_node=$1 torch_dist.py $2 $M $B 2>&1 | grep -E '^\{' ); }
for m in ddp zero1 zero2 fsdp; do bench 4 $m; done
# ddp with bf16 gradient collectives (parallel.grad_reduce bf16; report as that).
bench 4 ddp --grad-reduce bf16
# DDP_MARGINS: ddp on 4 GPUs again with these weight-gradient SM margins (FORGE_WGRAD_SM_MARGIN).
for g in ${DDP_MARGINS:-}; do
  echo "wgrad_sm_margin $g:"; FORGE_WGRAD_SM_MARGIN=$g bench 4 ddp
done
[ -z "${SKIP_CE:-}" ] && bench 4 ddp --ddp-allreduce copy_engine
torch 4 ddp; torch 4 fsdp
[ -z "${SKIP_CLI:-}" ] && left 500 &&
  timeout 120 bash scripts/device_cli_multi.sh 2>&1 | grep -E "identical|DIFFER|resharding|done:|rror"
for m in ddp fsdp; do bench 2 $m; done
bench 2 ddp --grad-reduce bf16
[ -z "${SKIP_CE:-}" ] && bench 2 ddp --ddp-allreduce copy_engine
torch 2 ddp 420; torch 2 fsdp 420
for m in zero1 zero2; do bench 2 $m; done
torch 1 ddp 480
echo "elapsed ${SECONDS}s"
