#!/bin/bash
# idist-run in place of torchrun in the pods of a Kubeflow PyTorchJob. No Kubernetes here: each
# pod is a network namespace on one bridge with a host name of its own, the job's service names
# (mnist-master-0, mnist-worker-N) in its /etc/hosts (ip netns exec mounts /etc/netns/NS/hosts
# there), and the variables the training operator sets in such a pod (its setPodEnv,
# pkg/controller.v1/pytorch/envvar.go, master.go and elastic.go), for both of its generations.
#   static, Master + 1 Worker, nprocPerNode 2: the tutorial's all_reduce gives [16, 20] on 4
#     ranks, WORLD_SIZE counting pods (before v1.7) or processes (v1.7+); the same with a
#     torch.distributed script;
#   elastic, 3 Workers, minReplicas 1, maxReplicas 3: pods join late, one is killed, the job
#     re-forms and ends right.
# usage: kubeflow_netns.sh IDIST_RUN EXAMPLES_DIR JOB_SUM     exits 77 (skipped) without namespaces
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
JOB_SUM=$(realpath "$3")
SCRIPT=$(cd "$(dirname "$0")" && pwd)/python/torch_all_reduce.py
PY=/usr/bin/python3
DIR=$(mktemp -d /tmp/idist-kubeflow.XXXXXX)
tag=$$
cleanup() {
  local i p
  for i in 0 1 2; do
    [ -n "${NS_HOST[i]:-}" ] || continue
    for p in $(ip netns pids "${NS_HOST[i]}" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done  # what this test started there
    rm -rf "/etc/netns/${NS_HOST[i]}"
  done
  netns_hosts_cleanup
  rm -rf "$DIR"
}
trap cleanup EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 3; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root, iproute2, unshare, CAP_NET_ADMIN)"
  exit 77
fi
# The pods' names, as the operator's services name them; every pod resolves every one.
PODS=(mnist-master-0 mnist-worker-0 mnist-worker-1)
for i in 0 1 2; do
  mkdir -p "/etc/netns/${NS_HOST[i]}"
  { echo "127.0.0.1 localhost"; for j in 0 1 2; do echo "${ADDR_HOST[j]} ${PODS[j]}"; done; } >"/etc/netns/${NS_HOST[i]}/hosts"
done
echo "# pods ${PODS[*]} at ${ADDR_HOST[*]}"
export IDIST_TIMEOUT=30

# pod I NAME VAR=VALUE... -- COMMAND...: COMMAND in pod I (host name NAME) with only the operator's
# variables (and PATH), in the background; output in $DIR/I.out, exit code in $DIR/I.rc.
pod() {
  local i=$1 name=$2
  shift 2
  local vars=()
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  rm -f "$DIR/$i.rc"
  (on_host "$i" "$name" env -i PATH="$PATH" HOME=/root "${vars[@]}" timeout 90 "$@" >"$DIR/$i.out" 2>&1
   echo $? >"$DIR/$i.rc") &
}
rc() { cat "$DIR/$1.rc" 2>/dev/null; }
out() { cat "$DIR/$1.out" 2>/dev/null; }
# The idist-run process in pod I (ranks are other programs), for a kill -9 of the pod's agent.
agent_in() {
  local p
  for p in $(ip netns pids "${NS_HOST[$1]}"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = idist-run ] && { echo "$p"; return; }
  done
}

# --- static PyTorchJob, Master + 1 Worker, nprocPerNode "2" -------------------------------------
port=$(random_port)
# v1.7+ (master.go, envvar.go): PET_* beside MASTER_*, WORLD_SIZE = 2 pods x 2 processes.
v17() {
  echo MASTER_ADDR=mnist-master-0 PET_MASTER_ADDR=mnist-master-0 MASTER_PORT=$port PET_MASTER_PORT=$port \
    WORLD_SIZE=4 RANK=$1 PET_NODE_RANK=$1 PET_NNODES=2 PET_NPROC_PER_NODE=2 PYTHONUNBUFFERED=1
}
# Before v1.7: WORLD_SIZE counts the pods; PET_NPROC_PER_NODE as an elasticPolicy's nProcPerNode
# or the pod spec's own env would set it.
v15() { echo MASTER_ADDR=mnist-master-0 MASTER_PORT=$port WORLD_SIZE=2 RANK=$1 PET_NPROC_PER_NODE=2 PYTHONUNBUFFERED=0; }

for generation in v17 v15; do
  port=$(random_port)
  pod 1 mnist-worker-0 $($generation 1) -- "$RUN" "$EX/all_reduce"
  pod 0 mnist-master-0 $($generation 0) -- "$RUN" "$EX/all_reduce"
  wait
  check "$generation static: the master pod and the worker pod exit 0 ($(rc 0)/$(rc 1))" equals "$(rc 0)/$(rc 1)" 0/0
  for r in 0 1; do check "... rank $r (master pod) gets [16, 20]" contains "$(out 0)" "Rank $r, After performing all_reduce: [16, 20]"; done
  for r in 2 3; do check "... rank $r (worker pod) gets [16, 20]" contains "$(out 1)" "Rank $r, After performing all_reduce: [16, 20]"; done
  [ "$(rc 0)/$(rc 1)" = 0/0 ] || { sed 's/^/#  master| /' "$DIR/0.out"; sed 's/^/#  worker| /' "$DIR/1.out"; }
done

# The plan says where each value came from.
plan=$(ip netns exec "${NS_HOST[1]}" env -i PATH="$PATH" $(v15 1) "$RUN" --dry-run "$EX/all_reduce" 2>&1)
check "--dry-run in an old worker pod: detected as one" contains "$plan" '"detected_by": "Kubeflow PyTorchJob pod (training-operator before v1.7)"'
check "... the pods from WORLD_SIZE" contains "$plan" '"nnodes": "WORLD_SIZE (pods: no PET_NODE_RANK, the operator before v1.7)"'

# torch.distributed, unchanged, with idist-run where the pod spec had torchrun.
if $PY -c 'import torch.distributed' 2>/dev/null; then
  port=$(random_port)
  pod 1 mnist-worker-0 $(v17 1) -- "$RUN" "$PY" "$SCRIPT"
  pod 0 mnist-master-0 $(v17 0) -- "$RUN" "$PY" "$SCRIPT"
  wait
  [ "$(rc 0)/$(rc 1)" = 0/0 ] || { sed "s/^/#  master| /" "$DIR/0.out"; sed "s/^/#  worker| /" "$DIR/1.out"; }
  check "torch.distributed script, v1.7 pods: both exit 0 ($(rc 0)/$(rc 1))" equals "$(rc 0)/$(rc 1)" 0/0
  check "... 4 ranks, each all_reduce [16, 20] right" equals "$(grep -cE '^Rank [0-3]/4 local_rank [01] args \[\]: all_reduce \[16, 20\] right' <<<"$(out 0; out 1)")" 4
  check "... torch sees torchrun's variables: TORCHELASTIC_RUN_ID and GROUP_RANK" eval \
    "ip netns exec ${NS_HOST[0]} env -i PATH=\"$PATH\" $(v17 0 | sed 's/PET_NNODES=2/PET_NNODES=1/;s/WORLD_SIZE=4/WORLD_SIZE=2/') \
      \"$RUN\" /bin/sh -c 'test -n \"\$TORCHELASTIC_RUN_ID\" && test \"\$GROUP_RANK\" = 0 && test \"\$ROLE_WORLD_SIZE\" = 2 && test \"\$TORCHELASTIC_MAX_RESTARTS\" = 0' >/dev/null 2>&1"
else
  echo "SKIP: $PY cannot import torch.distributed: the torch.distributed part (scripts/setup.sh installs python3-torch)"
fi

# --- elastic PyTorchJob: 3 Workers, minReplicas 1, maxReplicas 3, maxRestarts 3 -----------------
# elastic.go: the pods meet at worker 0 (PET_RDZV_ENDPOINT), PET_NNODES MIN:MAX, no RANK.
rport=$(random_port)
elastic="PET_RDZV_ENDPOINT=mnist-worker-0:$rport PET_RDZV_BACKEND=c10d PET_NNODES=1:3 PET_MAX_RESTARTS=3
  PET_NPROC_PER_NODE=2 PET_RDZV_ID=mnist-$tag PET_RDZV_CONF=last_call_timeout=0.5 PET_MONITOR_INTERVAL=5 PYTHONUNBUFFERED=1"
listening() { ip netns exec "${NS_HOST[$1]}" ss -Hltn "sport = :$2" 2>/dev/null | grep -q .; }
pod 1 mnist-worker-0 $elastic -- "$RUN" -v --grace 1 "$JOB_SUM" 200 25 5
for i in $(seq 200); do listening 1 "$rport" && break; sleep 0.05; done
sleep 1  # worker 0 alone: 1 of 1:3 is enough, its 2 ranks start
pod 2 mnist-worker-1 $elastic -- "$RUN" --grace 1 "$JOB_SUM" 200 25 5
wait_for_lines "$DIR/1.out" "joined" 1
sleep 1
pod 0 mnist-master-0 $elastic -- "$RUN" --grace 1 "$JOB_SUM" 200 25 5
wait_for_lines "$DIR/1.out" "joined" 2
sleep 1.5  # the three pods' 6 ranks run
victim=$(agent_in 2)
[ -n "$victim" ] && kill -9 "$victim"
wait
echo "# elastic: exit $(rc 1)/$(rc 0)/$(rc 2) (worker-0/master-0/worker-1, killed)"
check "elastic: the pods that joined late re-formed the job each time" \
  eval 'contains "$(out 1)" "the node on mnist-worker-1 joined" && contains "$(out 1)" "the node on mnist-master-0 joined"'
check "... after worker-1's idist-run is killed, the other two pods exit 0 ($(rc 1)/$(rc 0))" equals "$(rc 1)/$(rc 0)" 0/0
check "... re-formed without it: 4 ranks, each sum 50 right" \
  equals "$(grep -cE 'rank [0-3]/4 port [0-9]+ attempt [0-9]+ sum 50 right' <<<"$(out 1; out 0)")" 4
check "... PET_MONITOR_INTERVAL is said to be ignored, not silently" contains "$(out 1)" "PET_MONITOR_INTERVAL=5 ignored"
[ "$(rc 1)/$(rc 0)" = 0/0 ] || for i in 1 0 2; do sed "s/^/#  pod $i| /" "$DIR/$i.out"; done

finish
