#!/usr/bin/env bash
# The body of Forge's Slurm batch jobs (forge-train.sbatch, forge-train-multinode.sbatch exec
# it): one worker per GPU of the allocation, stopping with a checkpoint and resuming from it.
#
#   forge-job.sh CONFIG            (inside an sbatch allocation)
#
# Two ways to launch (FORGE_LAUNCH):
#   coordinator (default)  start forge-coordinator on the first node (or use FORGE_COORDINATOR),
#       submit CONFIG with forgectl, or resume the run this CONFIG started before (its id is
#       kept in FORGE_STATE_DIR), `srun --mpi=pmix forge-worker` one per GPU, and watch the run.
#       A worker step that fails while the run goes on (a worker killed, crashed or hung) is
#       launched again in the same allocation, with backoff, up to train.max_restarts times.
#       A node whose workers failed train.node_failure_limit times is left out of the next
#       steps (srun --exclude) when the rest of the allocation still holds train.min_workers
#       workers (and a world that keeps the global batch): the coordinator continues the run
#       on them from its last checkpoint (elastic continue). train.node_cooldown_s later every
#       node is tried again with a step beside the running one, and the run grows back onto
#       it. A coordinator the job started that dies is started again on the same port from its
#       durable state.
#   direct  every rank is `forge train CONFIG [flags]` (no coordinator); extra arguments go to
#       forge train, and `--resume $FORGE_RESUME` (default latest) continues from the last
#       checkpoint under the config's run_dir.
#
# Environment:
#   FORGE_BIN_DIR      where forge, forge-coordinator, forge-worker, forgectl are (default: PATH)
#   FORGE_STATE_DIR    coordinator mode: its state (SQLite), run directories, generated
#                      secrets and the run id of each config; on a filesystem every node sees.
#                      Default: $SLURM_SUBMIT_DIR/forge-state
#   FORGE_COORDINATOR  host:port of a running coordinator to use instead of starting one
#                      (then FORGE_TOKEN and FORGE_JOIN_SECRET must be set)
#   FORGE_COORDINATOR_LISTEN  the address the started coordinator binds (default 0.0.0.0)
#   FORGE_COORDINATOR_METRICS_PORT  the started coordinator's /metrics port (default 9400,
#                      the coordinator target of deploy/prometheus/prometheus.yml; 0: none;
#                      any: a free port, logged, another one after a restart)
#   FORGE_WORKER_ARGS  extra forge-worker flags (e.g. --throttle-ms 20)
#   FORGE_HEARTBEAT_TIMEOUT_MS  the started coordinator's worker heartbeat timeout (10000)
#   FORGE_DATA_ROOT    where the started coordinator lets CONFIG's data.dataset_dir point
#                      (--data-root; default /: the job's coordinator serves only the job's
#                      owner, who may read any of their own files)
#   FORGE_RESUME       direct mode: latest (default), step_N or a path
#   FORGE_COORDINATOR_HOST  the address workers reach the started coordinator at (default:
#                      this node's NodeAddr as Slurm knows it; the batch script runs on the
#                      allocation's first node)
#   FORGE_NCCL_AUTO    1 (default): each task sets NCCL_SOCKET_IFNAME and NCCL_IB_HCA on its own
#                      node where they are not set already (below); 0: leave them to NCCL
#
# Several nodes: every task (worker or rank) runs with
#   LOCAL_RANK=$SLURM_LOCALID  its rank on its node (its GPU where the tasks share the node's
#                      GPUs; its /metrics port is metrics.port + LOCAL_RANK)
#   NCCL_SOCKET_IFNAME  unless set: the interface the node routes the coordinator's address
#                      through (`ip route get`): NCCL's bootstrap and socket transport then use
#                      the network the nodes reach each other on, not a docker bridge or a
#                      management port NCCL might pick first
#   NCCL_IB_HCA        unless set: =HCA:PORT,... of the InfiniBand ports that are ACTIVE
#                      (/sys/class/infiniband/*/ports/*/state); none: unset, NCCL uses sockets
# Set either variable for the job (sbatch --export or the environment it is submitted from) to
# choose yourself, e.g. NCCL_SOCKET_IFNAME=ib0 or NCCL_IB_HCA==mlx5_0:1,mlx5_1:1.
#
# Stopping (what Slurm sends, and what happens):
#   scancel / scontrol requeue / preemption: Slurm sends SIGTERM to every process of the job,
#     then SIGKILL after KillWait (default 30 s). The workers ignore it here; the coordinator
#     exits on it and is restarted from its durable state; this script asks it to stop the run
#     (`forgectl stop`: every worker saves a checkpoint, the coordinator commits it), then ends. In direct mode each rank's
#     `forge train` saves at its next step boundary and exits. The next job (a resubmission or
#     the requeued job) resumes from that checkpoint.
#   the time limit: `#SBATCH --signal=B:USR1@180` warns this script 180 s before; it stops the
#     run the same way, then requeues the job so training continues in a new allocation.
set -uo pipefail

log() { echo "forge-slurm: $*"; }
die() { echo "forge-slurm: error: $*" >&2; exit 1; }

if [ $# -lt 1 ]; then
  echo "usage: sbatch forge-train.sbatch CONFIG [forge train flags (FORGE_LAUNCH=direct)]" >&2
  exit 2
fi
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm allocation (submit with sbatch)"
config=$1
shift
[ -f "$config" ] || die "no config file $config"
config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config")
launch=${FORGE_LAUNCH:-coordinator}
bin() { echo "${FORGE_BIN_DIR:+$FORGE_BIN_DIR/}$1"; }
ntasks=${SLURM_NTASKS:-1}
log "job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
    "$ntasks workers, config $config, $launch launch"

stop_reason=""
on_term() { stop_reason=cancelled; log "SIGTERM: stopping the run with a checkpoint"; request_stop; }
on_usr1() { stop_reason=time_limit; log "time limit near: stopping the run with a checkpoint"; request_stop; }

# What every task sets on its own node before it starts (see "Several nodes" above); its
# output names the choices. FORGE_COORDINATOR_ADDR is the coordinator's address, when known.
read -r -d '' task_env <<'EOF_TASK_ENV'
export LOCAL_RANK=${SLURM_LOCALID:-0}
if [ "${FORGE_NCCL_AUTO:-1}" != 0 ]; then
  if [ -z "${NCCL_SOCKET_IFNAME:-}" ] && [ -n "${FORGE_COORDINATOR_ADDR:-}" ]; then
    dev=$(ip -o route get "$FORGE_COORDINATOR_ADDR" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p')
    if [ -n "$dev" ]; then export NCCL_SOCKET_IFNAME=$dev; fi
  fi
  if [ -z "${NCCL_IB_HCA:-}" ]; then
    hcas=""
    for st in /sys/class/infiniband/*/ports/*/state; do
      [ -r "$st" ] && grep -q ACTIVE "$st" || continue
      port=${st%/state}; hca=${st#/sys/class/infiniband/}
      hcas="${hcas:+$hcas,}${hca%%/*}:${port##*/}"
    done
    if [ -n "$hcas" ]; then export NCCL_IB_HCA="=$hcas"; fi
  fi
fi
EOF_TASK_ENV
export FORGE_COORDINATOR_ADDR=""

# srun does not take --cpus-per-task from sbatch since Slurm 22.05: pass it on.
srun_flags=(--mpi=pmix --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}")
if [ -n "${SLURM_GPUS_PER_TASK:-}" ]; then srun_flags+=(--gpus-per-task="$SLURM_GPUS_PER_TASK"); fi

# Where each task runs, its node-local rank, the NCCL interfaces it chose and which GPU it got
# (one line per rank, for the job log): after the coordinator's address is known (log_ranks).
log_ranks() {
  srun "${srun_flags[@]}" --mpi=none bash -c "$task_env"'
echo "forge-slurm: rank $SLURM_PROCID on ${SLURMD_NODENAME:-$(hostname -s)} local $LOCAL_RANK NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-} NCCL_IB_HCA=${NCCL_IB_HCA:-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"' |
    sort -k3,3n
}

# The address of this node (the allocation's first: where the batch script and the coordinator
# run) as the other nodes reach it: FORGE_COORDINATOR_HOST, else Slurm's NodeAddr of this node,
# else its host name.
this_node_addr() {
  if [ -n "${FORGE_COORDINATOR_HOST:-}" ]; then echo "$FORGE_COORDINATOR_HOST"; return; fi
  local node=${SLURMD_NODENAME:-$(hostname -s)} addr
  addr=$(scontrol show node "$node" -o 2>/dev/null | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
  echo "${addr:-$(hostname)}"
}
# FORGE_COORDINATOR_ADDR for the tasks: an IP address of host:port's host.
coordinator_ip() {
  local host=${1%:*}
  getent ahostsv4 "$host" 2>/dev/null | awk 'NR == 1 { print $1 }'
}
first_node=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | head -n 1)
if [ -n "$first_node" ] && [ -n "${SLURMD_NODENAME:-}" ] && [ "$first_node" != "$SLURMD_NODENAME" ]; then
  log "note: this script runs on $SLURMD_NODENAME, not the allocation's first node $first_node"
fi

# Waits for a background process; a trapped signal interrupts `wait` (status > 128), so wait
# again until it has really exited. Sets rc.
wait_for() {
  while true; do
    wait "$1"
    rc=$?
    if [ "$rc" -gt 128 ] && kill -0 "$1" 2>/dev/null; then continue; fi
    return
  done
}

# ---- direct: forge train on every rank ---------------------------------------------------
run_direct() {
  step_pid=""
  request_stop() {
    # scancel already signalled every rank; the time-limit warning reaches only this script:
    # srun forwards SIGUSR1 to the ranks.
    if [ "$stop_reason" = time_limit ] && [ -n "$step_pid" ]; then kill -USR1 "$step_pid" 2>/dev/null; fi
  }
  trap on_term TERM
  trap on_usr1 USR1
  FORGE_COORDINATOR_ADDR=$(coordinator_ip "$(this_node_addr)")
  export FORGE_COORDINATOR_ADDR
  log_ranks
  srun "${srun_flags[@]}" --kill-on-bad-exit=1 bash -c "$task_env"'
exec "$0" "$@"' "$(bin forge)" train "$config" "$@" --resume "${FORGE_RESUME:-latest}" &
  step_pid=$!
  wait_for "$step_pid"
}

# ---- coordinator: forge-coordinator + forge-worker per GPU + forgectl ---------------------
json_field() {  # json_field KEY < one JSON object: its top-level string or number value
  sed -n "s/^{.*\"$1\":\"\{0,1\}\([^\",}]*\).*/\1/p" | head -n 1
}

run_coordinator() {
  [ $# -eq 0 ] || die "extra arguments ($*) are for FORGE_LAUNCH=direct; put them in $config"
  local state=${FORGE_STATE_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/forge-state}
  mkdir -p "$state/slurm" || die "cannot create $state"
  state=$(cd "$state" && pwd)
  local coord_pid="" coord_port="" workers_pid="" watch_pid="" run=""

  local timeout_ms=${FORGE_HEARTBEAT_TIMEOUT_MS:-10000}
  # start_coordinator PORT (0: any): forge-coordinator in the background on this node.
  start_coordinator() {
    local addr_file=$state/slurm/coordinator-$SLURM_JOB_ID.address
    rm -f "$addr_file"
    "$(bin forge-coordinator)" --state-dir "$state" \
      --listen "${FORGE_COORDINATOR_LISTEN:-0.0.0.0}:$1" --address-file "$addr_file" \
      --token-file "$state/secrets/token" --join-secret-file "$state/secrets/join-secret" \
      --heartbeat-timeout-ms "$timeout_ms" --data-root "${FORGE_DATA_ROOT:-/}" \
      --metrics-port "${FORGE_COORDINATOR_METRICS_PORT:-9400}" &
    coord_pid=$!
    for _ in $(seq 300); do [ -s "$addr_file" ] && break; sleep 0.1; done
    [ -s "$addr_file" ] || die "forge-coordinator did not start (see above)"
    coord_port=$(sed 's/.*://' "$addr_file")
  }
  if [ -z "${FORGE_COORDINATOR:-}" ]; then
    # Secrets for this state dir, made once and kept (requeued jobs reuse them).
    (umask 077; mkdir -p "$state/secrets"
     for f in token join-secret; do
       [ -s "$state/secrets/$f" ] || od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$state/secrets/$f"
     done)
    FORGE_TOKEN=$(cat "$state/secrets/token")
    FORGE_JOIN_SECRET=$(cat "$state/secrets/join-secret")
    # (A reopened state's workers of earlier jobs are never placed: the coordinator places a
    # run only on workers it has heard from since it started.)
    start_coordinator 0
    FORGE_COORDINATOR="$(this_node_addr):$coord_port"
  fi
  [ -n "${FORGE_TOKEN:-}" ] && [ -n "${FORGE_JOIN_SECRET:-}" ] ||
    die "FORGE_COORDINATOR is set: FORGE_TOKEN and FORGE_JOIN_SECRET must be too"
  FORGE_COORDINATOR_ADDR=$(coordinator_ip "$FORGE_COORDINATOR")
  export FORGE_COORDINATOR FORGE_TOKEN FORGE_JOIN_SECRET FORGE_COORDINATOR_ADDR
  log "coordinator $FORGE_COORDINATOR, state $state"
  log_ranks
  ctl() { "$(bin forgectl)" "$@"; }

  # The run this config started in an earlier job (resubmitted or requeued), else a new one.
  local id_file=$state/slurm/$(basename "$config").run json st
  if [ -s "$id_file" ]; then
    run=$(cat "$id_file")
    json=$(ctl --json status "$run") || die "cannot reach the coordinator for run $run"
    st=$(json_field state <<<"$json")
    log "run $run ($st, checkpoint step $(json_field latest_checkpoint_step <<<"$json"))"
    case "$st" in
      STOPPED|FAILED) ctl resume "$run" --workers "$ntasks" || die "cannot resume $run" ;;
      COMPLETED) log "run $run already completed" ;;
    esac
  else
    json=$(ctl --json submit "$config") || die "forgectl submit $config failed"
    run=$(json_field id <<<"$json")
    echo "$run" > "$id_file"
    log "submitted $run"
    if [ "$(json_field workers <<<"$json")" != "$ntasks" ]; then
      # The job's worker count wins over train.workers (not placed yet: stops at once).
      log "train.workers in $config is $(json_field workers <<<"$json"): running on $ntasks"
      ctl stop "$run" --now >/dev/null && ctl resume "$run" --workers "$ntasks" >/dev/null ||
        die "cannot set $run to $ntasks workers"
    fi
  fi

  # spec_int KEY < the run's status JSON: KEY's number in its (normalised) spec YAML, whose
  # lines arrive as one JSON string ("\n  min_workers: 2\n"); spec_secs KEY: a number of
  # seconds there ("12.5"), rounded up to whole seconds.
  spec_int() { grep -o "\\\\n  $1: [0-9]*" | head -n 1 | sed 's/.*: //'; }
  spec_secs() {
    grep -o "\\\\n  $1: [0-9.e+]*" | head -n 1 | sed 's/.*: //' |
      awk '{ s = $1 + 0; printf "%d\n", (s == int(s)) ? s : int(s) + 1 }'
  }

  # The worker step, relaunched in this allocation while the run goes on: a lost worker (killed,
  # crashed, or aborted by the coordinator after a hang) loses the run's placement, the
  # coordinator restarts the run from its last committed checkpoint and tells the step's other
  # workers to abort (they exit 3), and a fresh step joins after a backoff (1 s, doubling to
  # 30 s; back to 1 s after a step that got the run a new checkpoint), at most the run's
  # train.max_restarts times. Each worker's shell notes its node, rank, exit status and step
  # ($state/slurm/exits-JOB.N); the first to fail names the node that ended the step. A node
  # that ended train.node_failure_limit steps is excluded when the rest keep train.min_workers;
  # train.node_cooldown_s later (twice as long after each further exclusion) a step on every
  # node is launched beside the running one (srun --overlap): when its workers join, the
  # coordinator stops the smaller world at a checkpoint and grows the run back onto them, and
  # that step is the job's worker step from then on (the node, on probation, is excluded again
  # at its next failure, for twice its last cool-down). A trial step that fails on a node it
  # tries leaves that node excluded for twice its last cool-down (one whose workers all end
  # well ran the run to its end or stop: no failure). A worker step that fails while
  # a trial step waits counts like any failure (against its node, which may be excluded then,
  # and train.max_restarts); the trial step then takes over unless it holds a node just excluded.
  # A step whose workers all ended well while the run goes on (the run grew back: its smaller
  # placement stopped with a checkpoint) is launched again at once.
  # The workers ignore SIGTERM too: they stop when the coordinator says so, after saving.
  # --max-placements 1: they exit when this job's run ends. SIGUSR2 (below) ends the steps and
  # the relaunching (an asynchronous subshell cannot trap SIGINT).
  run_workers() {
    trap '' TERM
    local step_pid="" stopping=0 relaunches=0 delay=1 json st max ck_before ck_after
    local nodes=() excluded="" steps=0 exits node rank code adopt=0 n
    local trial_pid="" trial_exits="" trial_nodes="" trial_bad="" launched_pid="" trials=1
    local -A node_fails=() excluded_at=() cooldown=()
    mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname -s)}" 2>/dev/null)
    [ ${#nodes[@]} -gt 0 ] || nodes=("$(hostname -s)")
    local per_node=$(( ntasks / ${#nodes[@]} > 0 ? ntasks / ${#nodes[@]} : 1 ))
    local step_flags=()
    # The run's train.node_failure_limit and train.node_cooldown_s (read again with each status).
    local limit=2 cool=300
    node_keys() {
      local v
      v=$(spec_int node_failure_limit <<<"$1")
      [ -n "$v" ] && limit=$v
      v=$(spec_secs node_cooldown_s <<<"$1")
      [ -n "$v" ] && cool=$v
      return 0
    }
    node_keys "$(ctl --json status "$run" 2>/dev/null)"
    # interrupt_srun PID: two SIGINTs within a second, which make srun end its step.
    interrupt_srun() { kill -INT "$1" 2>/dev/null; sleep 0.2; kill -INT "$1" 2>/dev/null; }
    # shellcheck disable=SC2317  # (run by the trap)
    end_steps() {
      local p
      for p in "$step_pid" "$trial_pid"; do
        if [ -n "$p" ]; then interrupt_srun "$p"; fi
      done
    }
    trap 'stopping=1; end_steps' USR2
    # launch_step EXITS [srun flags]: a worker step in the background (its pid: launched_pid).
    launch_step() {
      local file=$1
      shift
      : > "$file"
      # shellcheck disable=SC2086
      FORGE_STEP_EXITS=$file srun "${srun_flags[@]}" "$@" bash -c "$task_env"'
[ "${SLURM_PROCID:-0}" = 0 ] && echo "${SLURM_STEP_ID:-}" > "$FORGE_STEP_EXITS.step"
trap "" TERM; "$0" "$@"; rc=$?; echo "${SLURMD_NODENAME:-$(hostname -s)} ${SLURM_PROCID:-?} $rc ${SLURM_STEP_ID:-?}" >> "$FORGE_STEP_EXITS"; exit $rc' \
        "$(bin forge-worker)" --max-placements 1 ${FORGE_WORKER_ARGS:-} &
      launched_pid=$!
    }
    # kill_step EXITS: SIGKILL to the tasks of the step a bad end in EXITS names.
    kill_step() {
      local id
      id=$(awk '$3 != 0 { print $4; exit }' "$1")
      [ -n "$id" ] && scancel --signal=KILL "$SLURM_JOB_ID.$id" 2>/dev/null
    }
    # first_bad EXITS: "node rank code" of the first worker that ended badly by itself (exit 3
    # is a worker the coordinator told to abort: not its node's fault).
    first_bad() { awk '$3 != 0 && $3 != 3 { print; exit }' "$1"; }
    # adopt_trial: the step on every node, waiting beside the one that ended, is the worker step
    # from now on (the loop does not launch one).
    adopt_trial() {
      step_pid=$trial_pid
      exits=$trial_exits
      trial_pid=""
      ck_before=$(json_field latest_checkpoint_step <<<"$json")
      adopt=1
    }
    # end_trial: the step on every node is ended; its idle workers have nothing to save. Keeps rc.
    # SIGKILL to its tasks (their step id is in the exits file's .step once they started): srun
    # ending a step itself sends SIGTERM, which the workers ignore, and waits KillWait for them.
    end_trial() {
      local keep_rc=$rc id=""
      if [ -n "$trial_pid" ]; then
        id=$(cat "$trial_exits.step" 2>/dev/null)
        if [ -n "$id" ]; then
          scancel --signal=KILL "$SLURM_JOB_ID.$id" 2>/dev/null
        else
          interrupt_srun "$trial_pid"
        fi
        wait_for "$trial_pid"
        trial_pid=""
      fi
      rc=$keep_rc
    }
    while true; do
      if [ "$adopt" = 1 ]; then
        adopt=0  # step_pid and exits are the trial step's
      else
        steps=$((steps + 1))
        exits=$state/slurm/exits-$SLURM_JOB_ID.$steps
        ck_before=$(ctl --json status "$run" 2>/dev/null | json_field latest_checkpoint_step)
        launch_step "$exits" "${step_flags[@]}"
        step_pid=$launched_pid
      fi
      # Once a task ended badly the placement is lost, but srun waits for every task, and a
      # worker that cannot hear the coordinator's ABORT (stopped, or hung before it joined) would
      # hold the step. 2 s after the first bad end (the
      # others, told to abort, are gone by then) the step's tasks are killed: scancel
      # --signal=KILL ends it at once. (Slurm's --kill-on-bad-exit is not used: it ends a step
      # with SIGTERM, which the workers ignore, and SIGKILL only after KillWait, and a step it
      # is terminating takes no further signal: it lingered until UnkillableStepTimeout.)
      local bad_since="" killed=0
      while kill -0 "$step_pid" 2>/dev/null; do
        if [ -z "$bad_since" ] && awk '$3 != 0 { bad = 1 } END { exit !bad }' "$exits"; then
          bad_since=$SECONDS
        fi
        if [ -n "$bad_since" ] && [ "$killed" = 0 ] &&
           [ $((SECONDS - bad_since)) -ge 2 ]; then
          log "worker step lost a worker $((SECONDS - bad_since)) s ago and has not ended: killing its tasks"
          kill_step "$exits"
          killed=1
        fi
        # An excluded node past its cool-down: a step on every node beside this one.
        if [ -z "$trial_pid" ] && [ "$trials" = 1 ] && [ -n "$excluded" ] && [ "$cool" -gt 0 ] &&
           [ -z "$bad_since" ]; then
          local due=""
          for n in $excluded; do
            [ $((SECONDS - excluded_at[$n])) -ge "${cooldown[$n]}" ] && due="${due:+$due }$n"
          done
          if [ -n "$due" ]; then
            steps=$((steps + 1))
            trial_exits=$state/slurm/exits-$SLURM_JOB_ID.$steps
            trial_nodes=$excluded
            trial_bad=""
            log "node(s) $trial_nodes excluded long enough (train.node_cooldown_s): trying every node again with a worker step of $ntasks beside the running one; the run grows back onto it at its next checkpoint"
            launch_step "$trial_exits" --overlap
            trial_pid=$launched_pid
          fi
        fi
        if [ -n "$trial_pid" ]; then
          if [ -z "$trial_bad" ] && awk '$3 != 0 { bad = 1 } END { exit !bad }' "$trial_exits"; then
            trial_bad=$SECONDS
            kill_step "$trial_exits"  # its other workers are idle: nothing to save
          fi
          if ! kill -0 "$trial_pid" 2>/dev/null; then
            wait_for "$trial_pid"
            node="" rank="" code=""
            read -r node rank code _ < <(first_bad "$trial_exits")
            [ -n "${node:-}" ] && node_fails[$node]=$(( ${node_fails[$node]:-0} + 1 ))
            if [ "$rc" = 0 ] && [ -z "$trial_bad" ]; then
              # Every worker of it ended well: the run restarted on its workers (they were idle
              # when it lost its placement) and ended or stopped there. Not a failure, and
              # nothing is left to try a node for.
              trials=0
              log "the worker step trying node(s) $trial_nodes again ended well (the run went on there and ended or stopped)"
            elif [ -n "${node:-}" ] && [[ " $trial_nodes " != *" $node "* ]]; then
              # A node of the running step ended it: the tried node(s) did not fail again.
              for n in $trial_nodes; do excluded_at[$n]=$SECONDS; done
              log "the worker step trying node(s) $trial_nodes again failed on $node (rank $rank, exit $code): failure ${node_fails[$node]} of $node; node(s) $trial_nodes tried again in ${cooldown[${trial_nodes%% *}]} s"
            else
              for n in $trial_nodes; do
                excluded_at[$n]=$SECONDS
                cooldown[$n]=$(( cooldown[$n] * 2 ))
              done
              log "the worker step trying node(s) $trial_nodes again failed${node:+ on $node (rank $rank, exit $code)}: still excluded, tried again in ${cooldown[${trial_nodes%% *}]} s (twice the last cool-down)"
            fi
            trial_pid=""
          fi
        fi
        sleep 0.5 & wait $! 2>/dev/null
      done
      wait_for "$step_pid"
      step_pid=""
      if [ "$stopping" = 1 ]; then
        local step_rc=$rc
        [ -n "$trial_pid" ] && wait_for "$trial_pid"
        return "$step_rc"
      fi
      json=$(ctl --json status "$run") || return "$rc"
      node_keys "$json"
      st=$(json_field state <<<"$json")
      max=$(json_field max_restarts <<<"$json")
      case "$st" in
        PENDING|RUNNING|RESTARTING) ;;
        *)  # ended, or stopping with a checkpoint: a trial step's idle workers are let go
          end_trial
          return "$rc" ;;
      esac
      # A step on every node waiting beside the one that ended takes over (the smaller world
      # stopped to grow back onto it, or lost a worker): its workers are already up, idle, and
      # the node(s) it tries are back, on probation (excluded again at their next failure).
      # A failure of the ended step still counts below, against its node and train.max_restarts.
      local adopting=0
      if [ -n "$trial_pid" ] && kill -0 "$trial_pid" 2>/dev/null; then
        adopting=1
        for n in $trial_nodes; do node_fails[$n]=$(( limit > 0 ? limit - 1 : 0 )); done
        excluded=""
        step_flags=()
      fi
      if [ "$rc" = 0 ]; then
        if [ "$adopting" = 1 ]; then
          log "worker step ended (exit 0) while a step on every node waits: run $run goes on there; node(s) $trial_nodes back (excluded again at their next failure)"
          adopt_trial
          continue
        fi
        log "worker step ended while run $run is $st: launching it again in 1 s"
        sleep 1 & wait $! 2>/dev/null
        continue
      fi
      # The first worker to end badly names the node (the others were ended with the step).
      # A stopped (hung) worker is killed with the step, shell and all: no node.
      node="" rank="" code=""
      read -r node rank code _ < <(first_bad "$exits")
      if [ -n "${node:-}" ]; then
        node_fails[$node]=$(( ${node_fails[$node]:-0} + 1 ))
        log "worker step failed on $node (rank $rank, exit $code): failure ${node_fails[$node]} of $node"
        if [ "$limit" -gt 0 ] && [ "${node_fails[$node]}" -ge "$limit" ] &&
           [[ " $excluded " != *" $node "* ]]; then
          local left=0 min micro global
          for n in "${nodes[@]}"; do
            [[ " $excluded $node " == *" $n "* ]] || left=$((left + per_node))
          done
          min=$(spec_int min_workers <<<"$json")
          [ "${min:-0}" -gt 0 ] || min=$(spec_int workers <<<"$json")
          micro=$(spec_int micro_batch <<<"$json")
          global=$(spec_int global_batch <<<"$json")
          if [ "$left" -ge "${min:-1}" ] && [ "$left" -gt 0 ] &&
             [ $(( ${global:-0} % (${micro:-1} * left) )) = 0 ]; then
            excluded="${excluded:+$excluded }$node"
            excluded_at[$node]=$SECONDS
            cooldown[$node]=$(( ${cooldown[$node]:-0} > 0 ? cooldown[$node] * 2 : cool ))
            step_flags=(--nodes=$(( left / per_node )) --ntasks="$left" --exclude="${excluded// /,}")
            log "node $node failed ${node_fails[$node]} time(s) (train.node_failure_limit $limit): excluded; the run goes on with $left worker(s) on the other node(s) (train.min_workers ${min:-?})$([ "$cool" -gt 0 ] && echo "; every node is tried again in ${cooldown[$node]} s (train.node_cooldown_s)")"
            if [ "$adopting" = 1 ]; then
              # The waiting step runs on every node, this one too: not taken over.
              log "the step on every node waiting beside it includes $node: ended; node(s) $trial_nodes back on the next step"
              end_trial
              adopting=0
            fi
          else
            log "node $node failed ${node_fails[$node]} time(s) (train.node_failure_limit $limit): not excluded: the other node(s) hold $left worker(s); the run needs train.min_workers ${min:-?} and a world that divides batch.global_batch ${global:-?} into micro-batches of ${micro:-?}"
          fi
        fi
      fi
      if [ "$relaunches" -ge "${max:-0}" ]; then
        log "worker step failed (exit $rc); not relaunched: $relaunches relaunch(es) made (train.max_restarts ${max:-0})"
        end_trial
        return "$rc"
      fi
      ck_after=$(json_field latest_checkpoint_step <<<"$json")
      if [ -n "$ck_before" ] && [ -n "$ck_after" ] && [ "$ck_after" -gt "$ck_before" ]; then
        delay=1  # that step got the run further: not a crash loop
      fi
      relaunches=$((relaunches + 1))
      if [ "$adopting" = 1 ]; then
        log "worker step failed (exit $rc), run $run $st: a step on every node waits: the run goes on there ($relaunches of ${max:-0}); node(s) $trial_nodes back (excluded again at their next failure)"
        adopt_trial
        continue
      fi
      log "worker step failed (exit $rc), run $run $st: relaunching it in $delay s ($relaunches of ${max:-0})"
      sleep "$delay" & wait $! 2>/dev/null
      [ "$stopping" = 1 ] && return "$rc"
      delay=$((delay * 2 > 30 ? 30 : delay * 2))
    done
  }
  run_workers &
  workers_pid=$!

  request_stop() {
    # scancel's SIGTERM also reached the coordinator we started (it cannot ignore it): it is
    # going down. Its state is durable, so replace it on the same port (the workers reconnect)
    # and let the new one commit the stop checkpoint.
    if [ "$stop_reason" = cancelled ] && [ -n "$coord_pid" ]; then
      kill -KILL "$coord_pid" 2>/dev/null
      wait "$coord_pid" 2>/dev/null
      start_coordinator "$coord_port"
    fi
    [ -n "$run" ] && ctl stop "$run"
  }
  trap on_term TERM
  trap on_usr1 USR1
  # watch ignores SIGTERM (scancel) so it reports the stop it causes.
  (trap '' TERM; exec "$(bin forgectl)" watch "$run") &
  watch_pid=$!
  # While the run goes on, a coordinator this job started that died (killed, crashed) is
  # started again on its port from its durable state: the workers and the watch reconnect.
  # Backoff 1 s, doubling to 30 s, back to 1 s after one that lived a minute.
  local coord_restarts=0 coord_delay=1 coord_started=$SECONDS workers_ended_at="" next_check=0 gave_up=0
  while kill -0 "$watch_pid" 2>/dev/null; do
    # (scancel's stop restarts it itself: request_stop)
    if [ -n "$coord_pid" ] && [ "$stop_reason" != cancelled ] && ! kill -0 "$coord_pid" 2>/dev/null; then
      wait "$coord_pid" 2>/dev/null
      local coord_rc=$?
      [ $((SECONDS - coord_started)) -ge 60 ] && coord_delay=1
      coord_restarts=$((coord_restarts + 1))
      log "forge-coordinator ended (exit $coord_rc): starting it again on port $coord_port in $coord_delay s ($coord_restarts)"
      sleep "$coord_delay" & wait $! 2>/dev/null
      [ "$stop_reason" = cancelled ] && continue
      start_coordinator "$coord_port"
      coord_started=$SECONDS
      coord_delay=$((coord_delay * 2 > 30 ? 30 : coord_delay * 2))
    fi
    # No worker step left (run_workers ended: restarts used up) while the run still waits for
    # workers: the loss of a placed attempt reaches the coordinator within two heartbeat
    # timeouts, and it fails the run itself; a run whose last workers died before they were
    # placed would wait for ever, so the job ends and leaves it to a resubmission.
    # Asked every 5 s from then on (a stop checkpoint may take a while to commit).
    if [ -z "$workers_ended_at" ] && ! kill -0 "$workers_pid" 2>/dev/null; then
      workers_ended_at=$SECONDS
      next_check=$((SECONDS + 2 * timeout_ms / 1000 + 2))
    fi
    if [ -n "$workers_ended_at" ] && [ "$SECONDS" -ge "$next_check" ]; then
      next_check=$((SECONDS + 5))
      st=$(ctl --json status "$run" 2>/dev/null | json_field state)
      case "$st" in
        PENDING|RUNNING|RESTARTING)
          log "no worker step left and run $run still $st $((SECONDS - workers_ended_at)) s later: ending the job; resubmit the same command to resume from its latest checkpoint"
          gave_up=1
          kill -KILL "$watch_pid" 2>/dev/null
          break ;;
      esac
    fi
    sleep 0.5 & wait $! 2>/dev/null
  done
  wait_for "$watch_pid"
  local watch_rc=$rc
  json=$(ctl --json status "$run")
  st=$(json_field state <<<"$json")
  log "run $run: $st at step $(json_field step <<<"$json") (checkpoint step $(json_field latest_checkpoint_step <<<"$json"))"

  # Workers end with their placement; ones never placed (the run had ended) are let go:
  # on SIGUSR2 run_workers sends srun two SIGINTs (two within a second end its step).
  for _ in $(seq 100); do kill -0 "$workers_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$workers_pid" 2>/dev/null; then kill -USR2 "$workers_pid" 2>/dev/null; fi
  wait_for "$workers_pid"
  local workers_rc=$rc
  if [ -n "$coord_pid" ]; then kill -INT "$coord_pid" 2>/dev/null; wait_for "$coord_pid"; fi
  case "$st" in
    COMPLETED|STOPPED) rc=0 ;;
    *) if [ "$gave_up" = 1 ]; then rc=$(( workers_rc == 0 ? 1 : workers_rc ));
       else rc=$(( watch_rc == 0 ? 1 : watch_rc )); fi ;;
  esac
}

case "$launch" in
  direct) run_direct "$@" ;;
  coordinator) run_coordinator "$@" ;;
  *) die "FORGE_LAUNCH must be coordinator or direct, got $launch" ;;
esac

case "$stop_reason" in
  time_limit)
    if [ "$rc" = 0 ]; then
      log "stopped with a checkpoint; requeueing job $SLURM_JOB_ID to continue"
      scontrol requeue "$SLURM_JOB_ID"
    fi ;;
  cancelled) log "stopped (exit $rc); resubmit the same command to resume" ;;
  *) log "done (exit $rc)" ;;
esac
exit "$rc"
