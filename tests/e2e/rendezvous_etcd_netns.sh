#!/bin/bash
# The rendezvous on etcd across "hosts" (network namespaces on one bridge): three hosts each run
# an etcd member, two of them an idist-run node too. The etcd member alone on host 2 loses its
# cable mid-job (no reset, no FIN: its connections go silent), and it is the first endpoint
# every node names: nothing changes for the job, which ends with every sum right.
# usage: rendezvous_etcd_netns.sh IDIST_RUN EXAMPLES_DIR JOB_SUM    exits 77 (skipped) without namespaces or etcd
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
JOB_SUM=$(realpath "$3")
skip_without_etcd
ETCD=$(command -v etcd)
DIR=$(mktemp -d /tmp/idist-etcd-netns.XXXXXX)
tag=$$
ETCD_PIDS=()
cleanup() {
  for p in "${ETCD_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  pkill -9 -f "rdzv-id etcd-netns-$tag" 2>/dev/null
  netns_hosts_cleanup
  rm -rf "$DIR"
}
trap cleanup EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 3; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root, iproute2, unshare, CAP_NET_ADMIN)"
  exit 77
fi
export IDIST_TIMEOUT=30
cluster="m0=http://${ADDR_HOST[0]}:2380,m1=http://${ADDR_HOST[1]}:2380,m2=http://${ADDR_HOST[2]}:2380"
for i in 0 1 2; do
  ip netns exec "${NS_HOST[i]}" "$ETCD" --name "m$i" --data-dir "$DIR/m$i" \
    --listen-client-urls "http://${ADDR_HOST[i]}:2379" --advertise-client-urls "http://${ADDR_HOST[i]}:2379" \
    --listen-peer-urls "http://${ADDR_HOST[i]}:2380" --initial-advertise-peer-urls "http://${ADDR_HOST[i]}:2380" \
    --initial-cluster "$cluster" --initial-cluster-token "idist-$tag" --initial-cluster-state new \
    >"$DIR/etcd$i.log" 2>&1 &
  ETCD_PIDS[i]=$!
  disown $!
done
# Host 2's member first: every node starts on the member that will be cut.
EP="${ADDR_HOST[2]}:2379,${ADDR_HOST[0]}:2379,${ADDR_HOST[1]}:2379"
for _ in $(seq 100); do
  ip netns exec "${NS_HOST[0]}" env ETCDCTL_API=3 etcdctl --endpoints "$EP" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done
check "the etcd cluster (3 members, one per host) is up" \
  ip netns exec "${NS_HOST[0]}" env ETCDCTL_API=3 etcdctl --endpoints "$EP" endpoint health
echo "# hosts at ${ADDR_HOST[*]}; etcd endpoints $EP"

start() {
  local i=$1
  shift
  (on_host "$i" "host$i" timeout 60 "$RUN" --verbose --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "$EP" \
     --rdzv-id "etcd-netns-$tag" -n 2 "$JOB_SUM" "$@" >"$DIR/h$i.out" 2>&1
   echo $? >"$DIR/h$i.rc") &
}
start 0 120 50 5
start 1 120 50 5
for _ in $(seq 100); do grep -q "attempt 0: node" "$DIR/h0.out" "$DIR/h1.out" 2>/dev/null && break; sleep 0.1; done
sleep 1
netns_cut 2
cut=$(now_ms)
wait
took=$(($(now_ms) - cut))
check "host 2 (an etcd member alone) cut mid-job: both nodes exit 0" equals "$(cat "$DIR/h0.rc")/$(cat "$DIR/h1.rc")" 0/0 ||
  tail -n 8 "$DIR/h0.out" "$DIR/h1.out"
check "... every rank's sum right" equals "$(cat "$DIR/h0.out" "$DIR/h1.out" | grep -cE 'rank [0-3]/4 port [0-9]+ attempt 0 sum 50 right')" 4
check "... in one attempt (no restart)" equals "$(cat "$DIR/h0.out" "$DIR/h1.out" | grep -c "attempt 1")" 0
echo "  (the job ended $took ms after the cut; 120 rounds of 50 ms)"
finish
