#!/bin/bash
# ddp with AdamW deferred into the next forward (CudaModelOptions::defer_update, on for ddp
# since session 12) against the update at the step's end (FORGE_CUDA_DEFER_UPDATE=0), in one
# multi-GPU device call: the 2- and 4-GPU tests first (device_dp_preamble.sh), then
# forge-dist-bench gpt350m B 16 ddp on 4 GPUs with NCCL's all-reduce (ROUNDS rounds, default
# 2, off/on alternated), on 4 GPUs with the copy engines and on 2 GPUs with NCCL (one round
# each). FORGE_CUDA_DEFER_UPDATE=0 also reaches each run's single-GPU baseline, so compare
# tokens_per_s_per_gpu between the runs; the "on" lines' efficiency is the default's.
set -u
cd "$(dirname "$0")/.."
source scripts/device_dp_preamble.sh
ab() { run ddp FORGE_CUDA_DEFER_UPDATE=0; run ddp FORGE_CUDA_DEFER_UPDATE=1; }
for r in ${ROUNDS:-1 2}; do W=4 ab; done
W=4 EXTRA="--ddp-allreduce copy_engine" ab
W=2 ab
echo "elapsed ${SECONDS}s"
