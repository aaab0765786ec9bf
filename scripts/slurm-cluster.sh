#!/usr/bin/env bash
# A throwaway Slurm cluster on this machine, for trainyard's Slurm backend tests and benchmarks.
#
#   scripts/slurm-cluster.sh start    # install slurm-wlm + munge if missing, start, register pool
#   scripts/slurm-cluster.sh stop     # cancel jobs, stop every daemon, unregister, remove state
#   scripts/slurm-cluster.sh status   # sinfo of the cluster (exit 1 when it is not up)
#   scripts/slurm-cluster.sh env      # the line to paste: export SLURM_CONF=...
#
# Layout: one munged (own key and socket), one slurmctld and two slurmd daemons as two nodes
# (ty-node1 on 127.0.0.1, ty-node2 on 127.0.0.2) of one partition `trainyard`, every file under
# $TRAINYARD_SLURM_DIR (default /tmp/trainyard-slurm). Debian's slurm-wlm is built with
# --enable-multiple-slurmd: each slurmd gets its own NodeName (`slurmd -N`), Port and spool dir.
# Each node declares this machine's real CPUs and memory (`slurmd -C`). No systemd, no
# cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none), no accounting (sacct is
# not available: trainyard falls back to squeue and the runner's events). Runs as root.
#
# `start` registers the pool `slurm-local` (backend: slurm) in $TRAINYARD_HOME/pools.yaml
# (default ~/.local/share/trainyard) and writes the same pools alone to $TRAINYARD_SLURM_DIR/pools.yaml;
# `slurm-local` declares the nodes' real capacity (strict). It also registers the rehearsal
# pool `slurm-rehearsal`: the same two nodes declaring 8 GPU slots, 64 CPUs, 512Gi and 2Ti each
# (virtual, as the local pool's), none of it asked of Slurm, so OSMO's GPU training specs run on
# this CPU-only cluster as GPU slots run as CPU processes on the local pool:
#   trainyard workflow submit examples/torchrun_multinode/train.yaml --pool slurm-rehearsal
# On a cluster already up, `start` only registers the pools (in a new $TRAINYARD_HOME).
# Slurm commands need SLURM_CONF=$TRAINYARD_SLURM_DIR/slurm.conf (the pool's options carry it).
#
# Environment: TRAINYARD_SLURM_DIR, TRAINYARD_SLURM_PORT (slurmctld's port; the slurmds use
# the next two; default 16817), TRAINYARD_HOME.
set -euo pipefail

STATE="${TRAINYARD_SLURM_DIR:-/tmp/trainyard-slurm}"
PORT="${TRAINYARD_SLURM_PORT:-16817}"
NODES=(ty-node1 ty-node2)
ADDRS=(127.0.0.1 127.0.0.2)
POOL=slurm-local
REHEARSAL_POOL=slurm-rehearsal
PARTITION=trainyard
CONF="$STATE/slurm.conf"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SLURM_CONF="$CONF" TRAINYARD_SLURM_DIR="$STATE"

say() { printf 'slurm-cluster: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

python_with_yaml() {
  local py
  for py in "$REPO/.venv/bin/python" python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import yaml' 2>/dev/null; then echo "$py"; return; fi
  done
  die "no python with PyYAML (make install, or apt-get install python3-yaml)"
}

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; run as root to install them"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# a process that exists and is not a zombie (a container's init may reap late)
running() { kill -0 "$1" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]; }
pid_alive() { [ -f "$1" ] && running "$(cat "$1")"; }

start_munge() {
  mkdir -p "$STATE/munge" && chmod 755 "$STATE/munge"
  [ -f "$STATE/munge/munge.key" ] || mungekey --create --keyfile="$STATE/munge/munge.key" --force
  chmod 600 "$STATE/munge/munge.key"
  munged --force --socket="$STATE/munge/munge.socket" --key-file="$STATE/munge/munge.key" \
    --pid-file="$STATE/munge/munged.pid" --seed-file="$STATE/munge/munged.seed" \
    --log-file="$STATE/munge/munged.log"
}

node_hardware() {
  # CPUs, board/socket/core/thread layout and RealMemory as slurmd itself detects them.
  slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //'
}

write_conf() {
  local host hardware i
  host="$(hostname -s)"
  hardware="$(node_hardware)"
  mkdir -p "$STATE/ctld" "$STATE/log"
  cat >"$CONF" <<EOF
# trainyard throwaway cluster (scripts/slurm-cluster.sh); see slurm.conf(5).
ClusterName=trainyard
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge/munge.socket
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# start jobs at once: no batching of submits (batch_sched_delay), backfill (the only
# scheduler of heterogeneous jobs) every second
SchedulerParameters=bf_interval=1,batch_sched_delay=0,sched_min_interval=0
# refuse at sbatch a job no node set of its partition can ever hold (a gang larger than the
# cluster) instead of leaving it pending for ever
EnforcePartLimits=ALL
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmdTimeout=60
EOF
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeHostname=$host NodeAddr=${ADDRS[$i]} Port=$((PORT + 1 + i)) $hardware State=UNKNOWN" >>"$CONF"
  done
  # OverSubscribe=FORCE:4: up to four jobs share a core (test tasks mostly sleep; memory
  # stays exclusive). trainyard's own scheduler still counts the CPUs tasks ask for.
  echo "PartitionName=$PARTITION Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4" >>"$CONF"
}

wait_idle() {
  local deadline=$((SECONDS + 60)) idle
  while [ $SECONDS -lt $deadline ]; do
    idle="$(sinfo --noheader --Node --states=idle --format=%N 2>/dev/null | sort -u | wc -l)"
    [ "$idle" -ge "${#NODES[@]}" ] && return 0
    sleep 0.2
  done
  sinfo >&2 || true
  die "nodes not idle after 60 s; logs in $STATE/log"
}

register_pool() {
  # $1: "alone" also (re)writes $STATE/pools.yaml (a fresh cluster); "home" only the home's file
  local py home
  py="$(python_with_yaml)"
  home="${TRAINYARD_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/trainyard}"
  mkdir -p "$home"
  "$py" - "$1" "$STATE/pools.yaml" "$home/pools.yaml" "$POOL" "$REHEARSAL_POOL" "$CONF" "$PARTITION" "${NODES[@]}" <<'EOF'
import os, re, subprocess, sys, yaml
which, alone, shared, pool, rehearsal, conf, partition, *nodes = sys.argv[1:]
hardware = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
cpus = int(re.search(r"\bCPUs=(\d+)", hardware).group(1))
memory_mib = int(re.search(r"\bRealMemory=(\d+)", hardware).group(1))
st = os.statvfs(os.path.dirname(alone))
storage_gib = st.f_bavail * st.f_frsize // 1024**3
body = {
    "backend": "slurm", "strict": True, "max_retries": 3,
    "nodes": [{"name": n, "cpu": cpus, "gpu": 0, "memory": f"{memory_mib}Mi",
               "storage": f"{storage_gib}Gi"} for n in nodes],
    "options": {"partition": partition, "slurm_conf": conf},
}
# The rehearsal pool: the same Slurm nodes declaring what OSMO's training specs ask (per node
# 8 GPU slots, 64 CPUs, 512Gi, 2Ti, as the local pool's virtual nodes), none of it asked of
# Slurm (requests: []): GPU slots run as CPU processes, as on the local pool.
rehearsal_body = {
    "backend": "slurm", "strict": False, "max_retries": 3,
    "nodes": [{"name": n, "cpu": 64, "gpu": 8, "memory": "512Gi", "storage": "2Ti"}
              for n in nodes],
    "options": {"partition": partition, "slurm_conf": conf, "requests": []},
}
pools = {pool: body, rehearsal: rehearsal_body}


def write(path, data):
    with open(path + ".tmp", "w") as out:
        yaml.safe_dump(data, out, sort_keys=False)
    os.replace(path + ".tmp", path)


if which == "alone":
    write(alone, {"pools": pools})
data = {}
if os.path.exists(shared):
    data = yaml.safe_load(open(shared)) or {}
data.setdefault("pools", {}).update(pools)
write(shared, data)
EOF
  say "pools $POOL and $REHEARSAL_POOL registered in $home/pools.yaml"
}

unregister_pool() {
  local py home
  home="${TRAINYARD_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/trainyard}"
  [ -f "$home/pools.yaml" ] || return 0
  py="$(python_with_yaml)" || return 0
  "$py" - "$home/pools.yaml" "$POOL" "$REHEARSAL_POOL" <<'EOF'
import os, sys, yaml
path, *names = sys.argv[1:]
data = yaml.safe_load(open(path)) or {}
gone = [name for name in names if name in (data.get("pools") or {})]
for name in gone:
    del data["pools"][name]
if gone:
    with open(path + ".tmp", "w") as out:
        yaml.safe_dump(data, out, sort_keys=False)
    os.replace(path + ".tmp", path)
EOF
}

start() {
  install_packages
  if pid_alive "$STATE/slurmctld.pid"; then
    say "already running (state in $STATE)"
    register_pool home  # a new $TRAINYARD_HOME gets the pools too
    return 0
  fi
  local t0=$SECONDS node
  rm -rf "$STATE"
  mkdir -p "$STATE"
  start_munge
  write_conf
  slurmctld -f "$CONF"
  for node in "${NODES[@]}"; do
    mkdir -p "$STATE/spool/$node"
    slurmd -f "$CONF" -N "$node"
  done
  wait_idle
  register_pool alone
  say "up in $((SECONDS - t0)) s: ${NODES[*]} (partition $PARTITION); export SLURM_CONF=$CONF"
}

stop_pidfile() {
  local file="$1" pid i
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  kill "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do running "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

kill_tree() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -9 "$1" 2>/dev/null || true
}

kill_leftover_stepds() {
  # slurmstepd processes of this cluster work in its log folder (their cwd is under $STATE);
  # they and the job processes under them go (normally scancel has ended them already)
  local dir stepd
  stepd="$(readlink -f "$(command -v slurmstepd || echo /usr/sbin/slurmstepd)")"
  for dir in /proc/[0-9]*; do
    [ "$(readlink "$dir/exe" 2>/dev/null)" = "$stepd" ] || continue
    case "$(readlink "$dir/cwd" 2>/dev/null)" in
      "$STATE"|"$STATE"/*) kill_tree "${dir#/proc/}" ;;
    esac
  done
}

stop() {
  if pid_alive "$STATE/slurmctld.pid"; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
    local i
    for i in $(seq 50); do
      [ -z "$(squeue --noheader --states=RUNNING,COMPLETING,CONFIGURING 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  local node
  for node in "${NODES[@]}"; do stop_pidfile "$STATE/slurmd-$node.pid"; done
  stop_pidfile "$STATE/slurmctld.pid"
  stop_pidfile "$STATE/munge/munged.pid"
  kill_leftover_stepds
  unregister_pool
  rm -rf "$STATE"
  say "stopped"
}

status() {
  pid_alive "$STATE/slurmctld.pid" || { say "not running"; return 1; }
  sinfo --Node
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
