#!/bin/bash
# ddp's efficiency with the same micro-batch on every rank and in the baseline (forge-dist-bench's
# default since session 13; --distinct-batches is the old form), one multi-GPU device call
# (~250 s): ROUNDS rounds (default 2) on W GPUs (default 4) of fp32 collectives, bf16, bf16 with
# the collectives started at once (FORGE_DP_COMM_WINDOW=0), and the collectives skipped
# (FORGE_DP_DIAG_SKIP_GRAD_COMM=1, diagnosis only: it should now read ~100%); then bf16
# windows-off once more with --distinct-batches, against session 13's call C.
set -u
cd "$(dirname "$0")/.."
TESTS=${TESTS:-NcclComm.CollectivesOnTwoAndFourGpus}
source scripts/device_dp_preamble.sh
for r in ${ROUNDS:-1 2}; do
  run ddp
  EXTRA="--grad-reduce bf16" run ddp
  EXTRA="--grad-reduce bf16" run ddp FORGE_DP_COMM_WINDOW=0
  run ddp FORGE_DP_DIAG_SKIP_GRAD_COMM=1
done
EXTRA="--grad-reduce bf16 --distinct-batches" run ddp FORGE_DP_COMM_WINDOW=0
echo "elapsed ${SECONDS}s"
