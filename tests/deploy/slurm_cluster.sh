#!/usr/bin/env bash
# A one-node Slurm cluster on loopback for tests, everything under one directory:
#   slurm_cluster.sh up DIR     munged + slurmctld + slurmd, node `hostname -s` with 4 CPUs and
#                               4 emulated GPUs; prints `export SLURM_CONF=...` on success
#   FORGE_SLURM_NODES=2 slurm_cluster.sh up DIR
#                               two emulated nodes on this host instead, fnode1 and fnode2 with
#                               2 CPUs and 2 GPUs each: one slurmd per node (`slurmd -N NAME`),
#                               each on its own port (NodeName ... Port=) with its own spool,
#                               log, pid file and TmpFS (%n: PMIx puts its per-step directories
#                               there, and two slurmds of one host would collide in /tmp)
#   slurm_cluster.sh down DIR   scontrol shutdown, then munged; removes nothing
# Needs root (mknod, daemons) and Debian's slurm-wlm + munge. Exit 77 when those are missing,
# so callers can skip with the reason printed on stderr.
# KillWait 90 s (Slurm's default 30): scancel's SIGTERM starts forge-job.sh's stop (coordinator
# restart, stop checkpoint, final status line); on a loaded 2-core CI machine that took longer
# than 30 s once, and SIGKILL cut the job log before its last line.
# Ports: FORGE_SLURM_PORT (slurmctld; the slurmds take the next ones), default 16817.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  echo "usage: $0 up|down DIR" >&2
  exit 2
fi
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/etc/slurm.conf

skip() { echo "slurm_cluster: $*" >&2; exit 77; }

wait_for() {  # wait_for SECONDS COMMAND...: poll every 0.1 s
  local limit=$1; shift
  for _ in $(seq $((limit * 10))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}

up() {
  [ "$(id -u)" = 0 ] || skip "needs root (daemons run as root, GPUs are emulated with mknod)"
  for b in munged mungekey slurmctld slurmd scontrol sinfo; do
    command -v "$b" >/dev/null 2>&1 || skip "$b not found (apt-get install slurm-wlm munge)"
  done
  local host port
  host=$(hostname -s)
  port=${FORGE_SLURM_PORT:-16817}
  local nodes=${FORGE_SLURM_NODES:-1}
  case "$nodes" in 1|2) ;; *) echo "slurm_cluster: FORGE_SLURM_NODES must be 1 or 2" >&2; exit 2 ;; esac
  mkdir -p "$dir"/{etc,state,spool,log,run,munge,dev}
  # munged checks its directories: no group/world write, and the socket's directory must be
  # searchable by everyone (Slurm's client commands talk to it).
  chmod 0711 "$dir" "$dir/munge"
  [ -f "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key"
  munged -f --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"

  # Four "GPUs": Slurm accepts only character devices in gres.conf (195 = the NVIDIA major).
  for i in 0 1 2 3; do
    [ -c "$dir/dev/fakegpu$i" ] || mknod "$dir/dev/fakegpu$i" c 195 "$i" 2>/dev/null ||
      { kill "$(cat "$dir/munge/munged.pid")"; skip "cannot mknod device nodes here (no CAP_MKNOD)"; }
  done
  local node_lines gres_lines names
  if [ "$nodes" = 1 ]; then
    names=$host
    node_lines="NodeName=$host NodeAddr=127.0.0.1 CPUs=4 RealMemory=20000 Gres=gpu:4 State=UNKNOWN"
    gres_lines="Name=gpu File=$dir/dev/fakegpu[0-3]"
    mkdir -p "$dir/spool/$host" "$dir/tmp/$host"
  else
    names="fnode[1-2]"
    node_lines="NodeName=fnode1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 1)) CPUs=2 RealMemory=10000 Gres=gpu:2 State=UNKNOWN
NodeName=fnode2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((port + 2)) CPUs=2 RealMemory=10000 Gres=gpu:2 State=UNKNOWN"
    gres_lines="NodeName=fnode1 Name=gpu File=$dir/dev/fakegpu[0-1]
NodeName=fnode2 Name=gpu File=$dir/dev/fakegpu[2-3]"
    mkdir -p "$dir/spool/fnode1" "$dir/spool/fnode2" "$dir/tmp/fnode1" "$dir/tmp/fnode2"
  fi
  cat > "$dir/etc/gres.conf" <<EOF
AutoDetect=off
$gres_lines
EOF
  cat > "$conf" <<EOF
ClusterName=forgetest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
TmpFS=$dir/tmp/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
GresTypes=gpu
SlurmdParameters=config_overrides
KillWait=90
MinJobAge=300
$node_lines
PartitionName=debug Nodes=$names Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP
EOF
  export SLURM_CONF=$conf
  slurmctld -f "$conf"
  if [ "$nodes" = 1 ]; then
    slurmd -f "$conf"
  else
    slurmd -f "$conf" -N fnode1
    slurmd -f "$conf" -N fnode2
  fi
  if ! wait_for 20 bash -c "[ \$(sinfo -h -N -o %T | grep -cE '^(idle|mixed|allocated)') = $nodes ]"; then
    echo "slurm_cluster: the nodes did not come up; logs:" >&2
    tail -n 20 "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log >&2 || true
    exit 1
  fi
  echo "export SLURM_CONF=$conf"
}

down() {
  export SLURM_CONF=$conf
  if [ -f "$dir/run/slurmctld.pid" ] || compgen -G "$dir/run/slurmd*.pid" >/dev/null; then
    # Jobs first (a test that failed midway leaves them): a slurmstepd whose slurmd is gone
    # stays behind.
    scancel --signal=KILL --full --state=RUNNING "--user=$(id -un)" >/dev/null 2>&1 || true
    scancel "--user=$(id -un)" >/dev/null 2>&1 || true
    wait_for 20 bash -c '[ -z "$(squeue -h 2>/dev/null)" ]' || true
    scontrol shutdown >/dev/null 2>&1 || true
    # scontrol shutdown stops both daemons; make sure, by pid, within a few seconds.
    for f in "$dir"/run/slurmctld.pid "$dir"/run/slurmd*.pid; do
      local pid
      pid=$(cat "$f" 2>/dev/null || true)
      [ -n "$pid" ] || continue
      wait_for 10 bash -c "! kill -0 $pid" || kill -9 "$pid" 2>/dev/null || true
    done
  fi
  local mpid
  mpid=$(cat "$dir/munge/munged.pid" 2>/dev/null || true)
  if [ -n "$mpid" ]; then
    kill "$mpid" 2>/dev/null || true
    wait_for 5 bash -c "! kill -0 $mpid" || kill -9 "$mpid" 2>/dev/null || true
  fi
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down DIR" >&2; exit 2 ;;
esac
