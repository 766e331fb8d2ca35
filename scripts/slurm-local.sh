#!/bin/bash
# A real SLURM on this machine, for tests and for trying idist-run under srun/sbatch.
#
#   scripts/slurm-local.sh start DIR [--nodes 1|2] [--cpus N]
#   scripts/slurm-local.sh stop DIR
#
# `start` writes DIR/slurm.conf, starts a munged, a slurmctld and one slurmd per node of its
# own, waits until every node is idle and prints the line to eval:
#   export SLURM_CONF=DIR/slurm.conf
# DIR/cluster.env says what it chose (CLUSTER, NODES, PORTS, MUNGE_DIR), for scripts to source.
# One node is called "localhost" (so its name resolves anywhere); two emulated nodes are
# CLUSTERn1 and CLUSTERn2, each its own slurmd on its own port, both mapped to 127.0.0.1 by one
# line in /etc/hosts, so srun -N2 gives real multi-node variables (SLURM_STEP_NODELIST=CLUSTERn[1-2]).
# `stop` kills the daemons by the pids in their pid files and takes its own line out of
# /etc/hosts. Needs root (SlurmUser=root). The settings and why: docs/SLURM-LOCAL.md.
#
# Several clusters can run at once, from different DIRs, and never meet: each has a unique
# ClusterName, node names and hosts line, its own munged socket, and free ports picked at
# start. Ready means our own slurmctld answers (it reports our ClusterName) and our daemons
# hold our ports: a check that only asked "is some SLURM up?" could be answered by another
# cluster that already held the ports.
set -euo pipefail

usage() { echo "usage: $0 start DIR [--nodes 1|2] [--cpus N] | stop DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
action=$1
dir=$2
shift 2
nodes=1
cpus=8
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) nodes=${2:?}; shift 2 ;;
    --cpus) cpus=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
case $nodes in 1|2) ;; *) echo "slurm-local: --nodes must be 1 or 2, not '$nodes'" >&2; exit 2 ;; esac

HOSTS_LOCK=/run/lock/idist-slurm-local.hosts.lock

kill_pidfile() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null || true)
  if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

hosts_tag() { echo "# idist slurm-local cluster $1"; }

# Takes out the /etc/hosts lines of cluster $1 and nobody else's. Under a lock, because two
# clusters editing the file at once would each write back a copy without the other's change.
remove_hosts_line() {
  local tag kept
  tag=$(hosts_tag "$1")
  (
    flock 9
    grep -qF -- "$tag" /etc/hosts 2>/dev/null || exit 0
    kept=$(grep -vF -- "$tag" /etc/hosts || true)
    # /etc/hosts may be a bind mount: rewrite it in place rather than replace it (sed -i
    # would), and without truncating first, so that a concurrent lookup never sees it empty.
    printf '%s\n' "$kept" 1<>/etc/hosts
    truncate -s "$(($(printf '%s\n' "$kept" | wc -c)))" /etc/hosts
  ) 9>>"$HOSTS_LOCK"
}

add_hosts_line() {
  ( flock 9; echo "$2  $(hosts_tag "$1")" >>/etc/hosts ) 9>>"$HOSTS_LOCK"
}

# Everything a start in this DIR did: daemons, munged and its directory, our hosts line.
stop() {
  local CLUSTER="" MUNGE_DIR=""
  # shellcheck disable=SC1091
  [ -f "$dir/cluster.env" ] && source "$dir/cluster.env"
  for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do kill_pidfile "$f"; done
  if [ -n "$MUNGE_DIR" ] && [ -d "$MUNGE_DIR" ]; then
    kill_pidfile "$MUNGE_DIR/munged.pid"
    rm -rf "$MUNGE_DIR"
  fi
  [ -n "$CLUSTER" ] && remove_hosts_line "$CLUSTER"
  rm -f "$dir/cluster.env"
}

if [ "$action" = stop ]; then
  [ -d "$dir" ] && stop
  exit 0
fi
[ "$action" = start ] || usage
[ "$(id -u)" -eq 0 ] || { echo "slurm-local: must run as root (SlurmUser=root)" >&2; exit 1; }
for tool in slurmctld slurmd munged sinfo scontrol ss flock; do
  command -v "$tool" >/dev/null || { echo "slurm-local: $tool not found (apt-get install slurmctld slurmd munge slurm-client)" >&2; exit 1; }
done

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
stop  # leftovers from an earlier start in the same DIR
rm -rf "$dir/state" "$dir"/spool-*
mkdir -p "$dir/state"

# Lower case letters only: a valid ClusterName, and a node name prefix without digits.
letters=abcdefghijklmnopqrstuvwxyz
cluster=idist
for _ in 1 2 3 4 5 6 7 8; do cluster+=${letters:$((RANDOM % 26)):1}; done
if [ "$nodes" -eq 1 ]; then names=(localhost); else names=("${cluster}n1" "${cluster}n2"); fi
# Job ids of their own too: two clusters that both number from 1 would run job 1 at once, and
# everything a job derives from its id (idist-run's port and run id) would be the same.
first_job=$(((RANDOM * 32768 + RANDOM) % 60000000 + 1000))

# munge: authentication between the SLURM daemons and clients. Our own munged, so that
# stopping another cluster (which may have started the system's one) cannot take ours down.
munge_dir=$(mktemp -d "/run/idist-slurm-munge-$cluster.XXXXXX")
chown munge:munge "$munge_dir"
chmod 0755 "$munge_dir"
cat >"$dir/cluster.env" <<EOF
CLUSTER=$cluster
NODES="${names[*]}"
MUNGE_DIR=$munge_dir
EOF
runuser -u munge -- /usr/sbin/munged --socket="$munge_dir/munge.socket" --pid-file="$munge_dir/munged.pid" \
  --log-file="$munge_dir/munged.log" --seed-file="$munge_dir/munged.seed"
for _ in $(seq 50); do munge -S "$munge_dir/munge.socket" -n 2>/dev/null | unmunge -S "$munge_dir/munge.socket" >/dev/null 2>&1 && break; sleep 0.1; done

if [ "$nodes" -eq 2 ]; then
  # The step's node names must resolve: rank 0's address is the first of them.
  add_hosts_line "$cluster" "127.0.0.1 ${names[*]}"
fi

listening() { [ -n "$(ss -Htln "sport = :$1")" ]; }

# n ports nobody listens on, below idist's default derived range (20000-32767) and the kernel's
# ephemeral one. Another start may pick the same in the same instant: then a daemon fails to
# bind, the ownership check below sees it and we try again with others.
free_ports() {
  local want=$1 got=() p
  while [ ${#got[@]} -lt "$want" ]; do
    p=$((10000 + (RANDOM * 32768 + RANDOM) % 10000))
    listening "$p" && continue
    [[ " ${got[*]} " == *" $p "* ]] && continue
    got+=("$p")
  done
  echo "${got[@]}"
}

# The port is held by the process whose pid is in the file.
holds_port() {
  local pid
  pid=$(cat "$2" 2>/dev/null) || return 1
  ss -Htlnp "sport = :$1" | grep -q "pid=$pid,"
}

write_conf() {
  local ctld_port=$1 node_lines="" i
  shift
  for i in "${!names[@]}"; do
    node_lines+="NodeName=${names[$i]} NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=${1:?} CPUs=$cpus State=UNKNOWN"$'\n'
    shift
  done
  cat >"$dir/slurm.conf" <<EOF
ClusterName=$cluster
FirstJobId=$first_job
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_dir/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldPort=$ctld_port
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
${node_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

# Up when our slurmctld and slurmds hold our ports, the controller that answers is ours, and
# every node is idle; the first contact can take a few seconds. 1: a daemon lost its port.
wait_ready() {
  local ports=("$@") i states="" name=""
  for _ in $(seq 300); do
    # A daemon that could not bind its port exits at once.
    for f in "$dir"/slurmctld.pid "$dir"/slurmd-*.pid; do
      [ -f "$f" ] && ! kill -0 "$(cat "$f")" 2>/dev/null && return 1
    done
    name=$(scontrol show config 2>/dev/null | sed -n 's/^ClusterName *= *//p')
    states=$(sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ')
    if [ "$name" = "$cluster" ] && [ "$states" = "idle " ]; then
      holds_port "${ports[0]}" "$dir/slurmctld.pid" || return 1
      for i in "${!names[@]}"; do holds_port "${ports[$((i + 1))]}" "$dir/slurmd-${names[$i]}.pid" || return 1; done
      return 0
    fi
    sleep 0.1
  done
  echo "slurm-local: nodes not idle after 30 s (controller's ClusterName: ${name:-none}, want $cluster; sinfo: ${states:-nothing}); logs in $dir" >&2
  return 2
}

export SLURM_CONF=$dir/slurm.conf
for attempt in 1 2 3; do
  read -r -a ports <<<"$(free_ports $((1 + ${#names[@]})))"
  write_conf "${ports[@]}"
  echo "PORTS=\"${ports[*]}\"" >>"$dir/cluster.env"
  slurmctld -f "$SLURM_CONF" -i
  for n in "${names[@]}"; do
    mkdir -p "$dir/spool-$n"
    slurmd -f "$SLURM_CONF" -N "$n"
  done
  rc=0
  wait_ready "${ports[@]}" || rc=$?
  [ $rc -eq 0 ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
  for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do kill_pidfile "$f"; done
  [ $rc -eq 1 ] || break
  echo "slurm-local: another process took one of ports ${ports[*]} (attempt $attempt); trying others" >&2
  sed -i '/^PORTS=/d' "$dir/cluster.env"
  rm -rf "$dir/state" "$dir"/spool-*
  mkdir -p "$dir/state"
done
stop
exit 1
