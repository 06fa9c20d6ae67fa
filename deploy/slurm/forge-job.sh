#!/usr/bin/env bash
# The body of Forge's Slurm batch jobs (forge-train.sbatch, forge-train-multinode.sbatch exec
# it): one rank per GPU of the allocation, stopping with a checkpoint and resuming from it.
#
#   forge-job.sh CONFIG [forge train flags...]      (inside an sbatch allocation)
#
# Environment:
#   FORGE_BIN      the forge binary (default: `forge` on PATH)
#   FORGE_RESUME   checkpoint to resume from: latest (default), step_N or a path. `latest`
#                  makes resubmitting, requeueing and restarting the same command continue
#                  the run from its last committed checkpoint (or report it finished).
#   FORGE_COORDINATOR  host:port of a running coordinator (control-plane mode, see LAUNCH)
#
# Stopping (what Slurm sends, and what happens):
#   scancel / scontrol requeue / preemption: Slurm sends SIGTERM to every rank (and to this
#     script), then SIGKILL after KillWait (default 30 s). Each rank's `forge train` saves a
#     checkpoint at its next step boundary and exits 0; a requeued job then starts again here
#     and resumes from that checkpoint.
#   the time limit: `#SBATCH --signal=B:USR1@180` warns this script 180 s before; it passes
#     SIGUSR1 to the ranks through srun (same checkpoint-and-exit), then requeues the job so
#     training continues in a new allocation.
set -uo pipefail

log() { echo "forge-slurm: $*"; }

if [ $# -lt 1 ]; then
  echo "usage: sbatch forge-train.sbatch CONFIG [forge train flags...]" >&2
  exit 2
fi
if [ -z "${SLURM_JOB_ID:-}" ]; then
  echo "forge-job.sh: not inside a Slurm allocation (submit with sbatch)" >&2
  exit 2
fi
config=$1
shift
FORGE_BIN=${FORGE_BIN:-forge}
FORGE_RESUME=${FORGE_RESUME:-latest}

ntasks=${SLURM_NTASKS:-1}
log "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
    "$ntasks ranks, config $config, resume $FORGE_RESUME"

step_pid=""
stop_reason=""
# scancel / requeue: Slurm signals every rank itself; remember why we are ending.
on_term() { stop_reason=cancelled; log "SIGTERM: ranks checkpoint and stop"; }
# Time-limit warning (--signal=B:USR1@...): srun forwards SIGUSR1 to every rank.
on_usr1() {
  stop_reason=time_limit
  log "time limit near: asking the ranks to checkpoint and stop"
  [ -n "$step_pid" ] && kill -USR1 "$step_pid" 2>/dev/null
}
trap on_term TERM
trap on_usr1 USR1

# srun does not take --cpus-per-task from sbatch since Slurm 22.05: pass it on.
srun_flags=(--mpi=pmix --kill-on-bad-exit=1 --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}")
if [ -n "${SLURM_GPUS_PER_TASK:-}" ]; then srun_flags+=(--gpus-per-task="$SLURM_GPUS_PER_TASK"); fi

# Where each rank runs and which GPU it got (one line per rank, for the job log).
srun "${srun_flags[@]}" --mpi=none bash -c \
  'echo "forge-slurm: rank $SLURM_PROCID on $(hostname -s) CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"' |
  sort -k3,3n

# ---- LAUNCH ------------------------------------------------------------------------------
# Today every rank is `forge train` and the ranks form one data-parallel group over MPI
# (PMIx from srun). With the control plane (forge-coordinator, forge-worker, forgectl) this
# block becomes:
#   coordinator=${FORGE_COORDINATOR:-$(first node):PORT}, started here with
#     `forge-coordinator --state-dir RUN_DIR/state &` unless FORGE_COORDINATOR is set
#   srun "${srun_flags[@]}" forge-worker --coordinator "$coordinator" &
#   forgectl --coordinator "$coordinator" submit "$config" --workers "$ntasks" (or resume)
# and the stop handlers call `forgectl stop` instead of relying on the ranks' signals.
srun "${srun_flags[@]}" "$FORGE_BIN" train "$config" "$@" --resume "$FORGE_RESUME" &
step_pid=$!
# ---- end LAUNCH --------------------------------------------------------------------------

# A trapped signal interrupts `wait` (status > 128); keep waiting until srun has exited.
while true; do
  wait "$step_pid"
  rc=$?
  if [ "$rc" -gt 128 ] && kill -0 "$step_pid" 2>/dev/null; then continue; fi
  break
done

case "$stop_reason" in
  time_limit)
    if [ "$rc" = 0 ]; then
      log "ranks stopped with a checkpoint; requeueing job $SLURM_JOB_ID to continue"
      scontrol requeue "$SLURM_JOB_ID"
    fi ;;
  cancelled) log "ranks stopped (exit $rc); resubmit the same command to resume" ;;
  *) log "training step ended (exit $rc)" ;;
esac
exit "$rc"
