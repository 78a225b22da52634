#!/usr/bin/env bash
# A one-node SLURM on this machine, to rehearse the cluster path (docs/paper.md, "On a SLURM
# cluster"): `aepg_jax.sweep --slurm` scripts, `srun -n 2 ... --config.distributed=True`.
#
#   bash scripts/slurm_local.sh start    # as root: installs slurm-wlm and munge from apt if
#                                        # missing, writes /etc/slurm/slurm.conf for this
#                                        # machine (its cores, memory a little below the total,
#                                        # its GPUs if /dev/nvidia0 exists; partition `debug`),
#                                        # starts munged, slurmctld, slurmd, waits until the node
#                                        # is idle (60 s at most); does nothing if already up
#   bash scripts/slurm_local.sh status   # one line: the node's state, or "not running" (exit 3)
#   bash scripts/slurm_local.sh stop     # stops the three daemons (by their pid files)
#
# Logs: /var/log/slurm/slurmctld.log, /var/log/slurm/slurmd.log. One line on success; on a
# failure one `slurm_local: error: ...` line on stderr and exit 1.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
LOGS=/var/log/slurm
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid
MUNGE_KEY=/etc/munge/munge.key
PARTITION=debug
WAIT_S=${SLURM_LOCAL_WAIT_S:-60}

die() {
  echo "slurm_local: error: $*" >&2
  exit 1
}

alive() { # alive PIDFILE: the process of the pid file runs
  [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

node_state() { # the node's state (idle, mixed, allocated, down*, ...) or nothing
  timeout 10 sinfo -h -N -p "$PARTITION" -o %T 2>/dev/null | head -n 1 || true
}

ready() {
  alive "$CTLD_PID" && alive "$SLURMD_PID" || return 1
  case "$(node_state)" in
    idle | mixed | allocated | completing) return 0 ;;
    *) return 1 ;;
  esac
}

summary() {
  local host cpus mem
  host=$(hostname -s)
  read -r cpus mem < <(timeout 10 sinfo -h -N -p "$PARTITION" -o '%c %m' | head -n 1)
  echo "node $host $(node_state) (${cpus} CPUs, ${mem} MiB${1:+, $1}), partition $PARTITION"
}

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
    command -v sbatch >/dev/null && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || die "slurm is not installed and there is no apt-get"
  local log=/tmp/slurm_local_apt.log packages=(slurm-wlm munge)
  export DEBIAN_FRONTEND=noninteractive
  # The packages' own service starts are not wanted (this script starts the daemons).
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && own_policy=1
  fi
  if ! apt-get install -y -qq --no-install-recommends "${packages[@]}" >"$log" 2>&1; then
    apt-get update -qq >>"$log" 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >>"$log" 2>&1 || {
      ((own_policy)) && rm -f "$policy"
      die "apt-get install ${packages[*]} failed (see $log): $(tail -n 1 "$log")"
    }
  fi
  ((own_policy)) && rm -f "$policy"
  return 0
}

write_conf() {
  local host cpus mem_mib real gpus=0 gres_line=""
  host=$(hostname -s)
  cpus=$(nproc)
  mem_mib=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
  real=$((mem_mib * 95 / 100)) # a little below the total: slurmd drains a node short of it
  shopt -s nullglob
  local devices=(/dev/nvidia[0-9]*)
  shopt -u nullglob
  gpus=${#devices[@]}
  mkdir -p /etc/slurm
  if ((gpus > 0)); then
    gres_line=" Gres=gpu:$gpus"
    echo "Name=gpu File=/dev/nvidia[0-$((gpus - 1))]" >"$GRES_CONF"
  else
    rm -f "$GRES_CONF"
  fi
  cat >"$CONF" <<EOF
# Written by scripts/slurm_local.sh: a one-node SLURM for rehearsals.
ClusterName=aepglocal
SlurmctldHost=$host
AuthType=auth/munge
CryptoType=crypto/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=30
MinJobAge=600
$( ((gpus > 0)) && echo "GresTypes=gpu")
NodeName=$host CPUs=$cpus RealMemory=$real$gres_line State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES DefMemPerCPU=$((real / cpus))
EOF
  GPUS=$gpus
}

start_munge() {
  if command -v munge >/dev/null && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
  if [[ ! -s $MUNGE_KEY ]]; then
    if command -v mungekey >/dev/null; then
      mungekey --create --keyfile="$MUNGE_KEY" >/dev/null
    else
      dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    fi
  fi
  chown munge:munge "$MUNGE_KEY" /etc/munge /var/lib/munge /var/log/munge /run/munge
  chmod 0400 "$MUNGE_KEY"
  chmod 0700 /etc/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged >/dev/null 2>&1 || /usr/sbin/munged --force >/dev/null 2>&1 ||
    die "munged does not start (see /var/log/munge/munged.log)"
  for _ in $(seq 50); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "munged started but munge -n | unmunge fails (see /var/log/munge/munged.log)"
}

start() {
  [[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts daemons)"
  if command -v sinfo >/dev/null && ready; then
    echo "slurm_local: already running: $(summary)"
    return 0
  fi
  install
  write_conf
  mkdir -p "$LOGS" /var/spool/slurmctld /var/spool/slurmd
  start_munge
  alive "$CTLD_PID" || slurmctld || die "slurmctld does not start (see $LOGS/slurmctld.log)"
  alive "$SLURMD_PID" || slurmd || die "slurmd does not start (see $LOGS/slurmd.log)"
  local deadline=$((SECONDS + WAIT_S))
  until ready; do
    if ((SECONDS >= deadline)); then
      die "the node is not idle after ${WAIT_S} s (state: $(node_state)); see $LOGS/slurmctld.log and $LOGS/slurmd.log"
    fi
    sleep 1
  done
  local gpus=""
  ((GPUS > 0)) && gpus="$GPUS GPUs"
  echo "slurm_local: started: $(summary "$gpus")"
}

stop_one() { # stop_one PIDFILE NAME
  alive "$1" || return 0
  local pid
  pid=$(cat "$1")
  kill "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  die "$2 (pid $pid) is still running 10 s after SIGTERM"
}

stop() {
  [[ $(id -u) == 0 ]] || die "must run as root"
  stop_one "$SLURMD_PID" slurmd
  stop_one "$CTLD_PID" slurmctld
  stop_one "$MUNGE_PID" munged
  echo "slurm_local: stopped"
}

status() {
  if command -v sinfo >/dev/null && alive "$CTLD_PID" && [[ -n $(node_state) ]]; then
    echo "slurm_local: running: $(summary)"
  else
    echo "slurm_local: not running"
    return 3
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *)
    echo "usage: bash scripts/slurm_local.sh start|stop|status" >&2
    exit 2
    ;;
esac
