#!/bin/bash
# A real SLURM on this machine, for tests and for trying idist-run under srun/sbatch.
#
#   scripts/slurm-local.sh start DIR [--nodes 1|2] [--cpus N]
#   scripts/slurm-local.sh stop DIR
#
# `start` writes DIR/slurm.conf, starts munged (if no munged answers), slurmctld and one
# slurmd per node, waits until every node is idle and prints the line to eval:
#   export SLURM_CONF=DIR/slurm.conf
# One node is called "localhost" (so its name resolves anywhere); two emulated nodes are
# node1 and node2, each its own slurmd on its own port, both mapped to 127.0.0.1 in
# /etc/hosts, so srun -N2 gives real multi-node variables (SLURM_STEP_NODELIST=node[1-2]).
# `stop` kills the daemons by the pids in their pid files (munged too when `start` started it)
# and takes its lines out of /etc/hosts. Needs root (SlurmUser=root).
# See ../shared/SLURM-LOCAL.md for why each setting is there.
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

HOSTS_TAG="added by idist scripts/slurm-local.sh"

stop_slurm() {
  for f in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid; do kill_pidfile "$f"; done
}

# Everything start did: the daemons (munged only if we started it) and our /etc/hosts lines.
stop() {
  stop_slurm
  kill_pidfile "$dir/munged.pid"
  if grep -q "$HOSTS_TAG" /etc/hosts 2>/dev/null; then
    # /etc/hosts may be a bind mount: rewrite it in place rather than replace it (sed -i would).
    local kept
    kept=$(grep -v "$HOSTS_TAG" /etc/hosts)
    printf '%s\n' "$kept" >/etc/hosts
  fi
}

if [ "$action" = stop ]; then
  [ -d "$dir" ] && stop
  exit 0
fi
[ "$action" = start ] || usage
[ "$(id -u)" -eq 0 ] || { echo "slurm-local: must run as root (SlurmUser=root)" >&2; exit 1; }
for tool in slurmctld slurmd munged sinfo; do
  command -v "$tool" >/dev/null || { echo "slurm-local: $tool not found (apt-get install slurmctld slurmd munge slurm-client)" >&2; exit 1; }
done

mkdir -p "$dir/state"
dir=$(cd "$dir" && pwd)

# munge: authentication between the SLURM daemons and clients.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  cp /run/munge/munged.pid "$dir/munged.pid" 2>/dev/null || true
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

if [ "$nodes" -eq 1 ]; then
  names=(localhost)
  node_lines="NodeName=localhost NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN"
else
  names=(node1 node2)
  node_lines="NodeName=node1 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=6821 CPUs=$cpus State=UNKNOWN
NodeName=node2 NodeHostname=$(hostname) NodeAddr=127.0.0.1 Port=6822 CPUs=$cpus State=UNKNOWN"
  # The step's node names must resolve: rank 0's address is the first of them.
  for n in "${names[@]}"; do
    getent hosts "$n" >/dev/null || echo "127.0.0.1 $n  # $HOSTS_TAG" >> /etc/hosts
  done
fi

cat > "$dir/slurm.conf" <<EOF
ClusterName=idistlocal
SlurmctldHost=$(hostname)(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
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
SlurmctldPort=6817
SlurmdPort=6818
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
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
export SLURM_CONF=$dir/slurm.conf

stop_slurm  # leftovers from an earlier run in the same DIR
slurmctld -f "$SLURM_CONF" -i
for n in "${names[@]}"; do
  mkdir -p "$dir/spool-$n"
  slurmd -f "$SLURM_CONF" -N "$n"
done

# Up when every node reports idle; the first contact can take a few seconds.
for _ in $(seq 300); do
  states=$(sinfo -h -N -o %T 2>/dev/null | sort -u | tr '\n' ' ')
  [ "$states" = "idle " ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.1
done
echo "slurm-local: nodes not idle after 30 s (sinfo: ${states:-nothing}); logs in $dir" >&2
stop
exit 1
