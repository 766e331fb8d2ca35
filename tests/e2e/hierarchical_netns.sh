#!/bin/bash
# The hierarchical path for real: two "hosts" (network namespaces joined by a veth pair, each
# with a host name of its own in a UTS namespace, so the ranks' host identities differ), two
# ranks on each. Within a host the ranks share memory; between hosts gloo carries one leader's
# bytes per host over the veth (IDIST_INTERHOST=gloo: ucx, where built, has ucx_netns.sh).
#  1. the whole collective matrix (every op, dtype, count and group shape: sub-groups within a
#     host, across hosts and mixed) on 4 ranks, and the tutorial's all_reduce;
#  2. a rank killed mid-run (ranks 0, 1 on host A, rank 2 on host B): every survivor raises
#     well within the timeout, and its host mate names it.
#  3. with TORCH_CHECK, idist::torch's torch_check on the 4 ranks (auto_model against one
#     process with the whole batch, and the rest).
# usage: hierarchical_netns.sh IDIST_RUN EXAMPLES_DIR MATRIX [TORCH_CHECK]
#        exits 77 (skipped) where namespaces can't be made
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EX=$(realpath "$2")
MATRIX=$(realpath "$3")
TORCH_CHECK=${4:+$(realpath "$4")}
tag=$$
TMP=$(mktemp -d)
trap 'netns_cleanup; rm -rf "$TMP"' EXIT
if ! command -v unshare >/dev/null || ! netns_pair $tag; then
  echo "SKIP: cannot create network namespaces and a veth pair here (needs root, iproute2, util-linux, CAP_NET_ADMIN)"
  exit 77
fi
echo "# hosts host-a$tag in $NS_A ($ADDR_A), host-b$tag in $NS_B ($ADDR_B)"

# on_host A|B COMMAND...: COMMAND in that host's network namespace, under its host name.
on_host() {
  local ns=$NS_A name=host-a$tag
  [ "$1" = B ] && ns=$NS_B name=host-b$tag
  shift
  ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

export IDIST_TIMEOUT=30 IDIST_JOB_TOKEN=hier$tag IDIST_INTERHOST=gloo
port=29599
node() {  # node K PROGRAM ARGS...: idist-run as node K of 2, two ranks
  local k=$1 host=A
  [ "$k" = 1 ] && host=B
  shift
  on_host $host "$RUN" --nnodes 2 --node-rank "$k" --master-addr "$ADDR_A" --master-port $port -n 2 "$@"
}

# two_nodes LABEL LIMIT PROGRAM: PROGRAM on both hosts (host A's node bounded by LIMIT s);
# checks both exit 0 and sets `all` to the 4 ranks' output.
two_nodes() {
  local label=$1 limit=$2 program=$3 b
  port=$((port + 1))
  node 1 "$program" >"$TMP/b" 2>&1 &
  b=$!
  out=$(timeout "$limit" bash -c "$(declare -f node on_host); tag=$tag NS_A=$NS_A NS_B=$NS_B ADDR_A=$ADDR_A RUN=$RUN port=$port node 0 $program" 2>&1)
  check "$label: host A's node exits 0" equals $? 0
  wait $b
  check "$label: host B's node exits 0" equals $? 0
  all="$out
$(cat "$TMP/b")"
}

two_nodes matrix 240 "$MATRIX"
echo "$all" | grep -E "checks|FAILED|backend:" | head -n 12
check "matrix: 4 ranks report no failure" equals "$(count "$all" "checks, 0 failed")" 4
check "matrix: every rank runs the hierarchical path" equals \
  "$(count "$all" "hierarchical: shared memory within each host, gloo among one leader per host")" 4

two_nodes all_reduce 60 "$EX/all_reduce"
check "all_reduce: the 4 ranks get [16, 20]" equals "$(count "$all" "After performing all_reduce: [16, 20]")" 4

if [ -n "$TORCH_CHECK" ]; then
  two_nodes torch_check 240 "$TORCH_CHECK"
  echo "$all" | grep -E "FAIL|checks" | head -n 8
  check "torch_check: 4 ranks report no failure over the hierarchical path" equals "$(count "$all" "checks, 0 failed")" 4
else
  echo "# torch_check: not built (no libtorch); skipped"
fi

# A rank dies mid-run; ranks started by hand, so that only the library stops the survivors.
export IDIST_TIMEOUT=20
port=$((port + 1))
start=$(now_ms)
pids=()
for r in 0 1 2; do
  host=A
  [ $r = 2 ] && host=B
  RANK=$r WORLD_SIZE=3 LOCAL_RANK=$((r % 2)) MASTER_ADDR=$ADDR_A MASTER_PORT=$port \
    timeout 60 bash -c "$(declare -f on_host); tag=$tag NS_A=$NS_A NS_B=$NS_B on_host $host $MATRIX --die" \
    >"$TMP/die.$r" 2>&1 &
  pids+=($!)
done
wait_codes "${pids[@]}"
elapsed=$(($(now_ms) - start))
cat "$TMP"/die.*
check "die: the dead rank exited 9" equals "${codes[1]}" 9
check "die: rank 0 (its host mate) raised (exit 3)" equals "${codes[0]}" 3
check "die: rank 2 (the other host) raised (exit 3)" equals "${codes[2]}" 3
check "die: rank 0 names rank 1" contains "$(cat "$TMP/die.0")" "connection to rank 1 lost"
check "die: the survivors were done well within the 20 s timeout ($elapsed ms)" test "$elapsed" -lt 15000

finish
