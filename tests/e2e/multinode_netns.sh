#!/bin/bash
# Two "hosts" that really talk over separate addresses: two network namespaces joined by a
# veth pair (10.77.X.1 and 10.77.X.2), one idist-run in each as node 0 and node 1.
# usage: multinode_netns.sh IDIST_RUN EXAMPLES_DIR     exits 77 (skipped) where namespaces can't be made
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")

tag=$$
cleanup() {
  netns_cleanup
  rm -f "/tmp/idist-netns-$tag.out"
}
trap cleanup EXIT
if ! netns_pair $tag; then
  echo "SKIP: cannot create network namespaces and a veth pair here (needs root, iproute2, CAP_NET_ADMIN)"
  exit 77
fi
A=$NS_A B=$NS_B
echo "# namespaces $A ($ADDR_A) and $B ($ADDR_B)"

port=29500
export IDIST_TIMEOUT=20 IDIST_JOB_TOKEN=netns$tag
OUT_B=/tmp/idist-netns-$tag.out
ip netns exec "$B" "$RUN" --nnodes 2 --node-rank 1 --master-addr "$ADDR_A" --master-port $port -n 2 \
  "$EX/all_reduce" >"$OUT_B" 2>&1 &
node_b=$!
out=$(timeout 60 ip netns exec "$A" "$RUN" --nnodes 2 --node-rank 0 --master-addr "$ADDR_A" --master-port $port -n 2 \
  "$EX/all_reduce" 2>&1)
check "node 0 in $A exits 0" equals $? 0
wait $node_b
check "node 1 in $B exits 0" equals $? 0
for r in 0 1; do check "rank $r (host A) gets [16, 20]" contains "$out" "Rank $r, After performing all_reduce: [16, 20]"; done
for r in 2 3; do check "rank $r (host B) gets [16, 20]" contains "$(cat "$OUT_B")" "Rank $r, After performing all_reduce: [16, 20]"; done

# Node 0 never starts: host B's idist-run fails within IDIST_TIMEOUT, naming where it looked.
out=$(IDIST_TIMEOUT=1 timeout 30 ip netns exec "$B" "$RUN" --nnodes 2 --node-rank 1 --master-addr "$ADDR_A" \
  --master-port $((port + 1)) -n 1 "$EX/all_reduce" 2>&1)
check "without node 0, host B fails naming $ADDR_A" contains "$out" "could not reach the rendezvous at $ADDR_A:$((port + 1))"

finish
