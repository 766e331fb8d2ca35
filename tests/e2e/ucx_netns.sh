#!/bin/bash
# UCX between hosts for real: two "hosts" (network namespaces on one bridge, each with a host
# name of its own), UCX over TCP on their veth (UCX_TLS=tcp: namespaces of one machine could
# otherwise share memory, which two hosts cannot).
#  1. the whole collective matrix, 2 ranks per host: shared memory within a host, ucx among the
#     host leaders (IDIST_INTERHOST=ucx), every rank saying so;
#  2. the matrix again, 1 rank per host: ucx carries the world, chosen by IDIST_INTERHOST=auto
#     and said by the ranks under idist-run -v;
#  3. IDIST_DEBUG=1's check that ranks call the same collective, and a late rank's timeout;
#     a host killed (its rank exits mid-run): the survivor raises within the timeout, naming
#     the peer and ucx, exit non-zero; ranks in all_reduces of different sizes raise at once;
#  4. a link cut under all_reduce (the host's cable down at the bridge: no reset, packets
#     dropped): both ranks raise within the timeout naming the other, exit non-zero; and
#     again under all_reduce with 2 ranks per host, in segments (the hierarchical pipeline)
#     and by rails, where a rank other than a leader also dies mid-run;
#  5. the matrix, a host killed, sizes that differ and a link cut with every collective message
#     on the TCP lanes beside UCX (IDIST_UCX_TCP_FROM=1); hosts whose IDIST_UCX_TCP_FROM
#     differs refused at init.
# usage: ucx_netns.sh IDIST_RUN MATRIX      exits 77 (skipped) where namespaces can't be made
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
MATRIX=$(realpath "$2")
tag=$$
TMP=$(mktemp -d)
trap 'netns_hosts_cleanup; rm -rf "$TMP"' EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 2; then
  echo "SKIP: cannot create network namespaces and a bridge here (needs root, iproute2, util-linux, CAP_NET_ADMIN)"
  exit 77
fi
echo "# hosts ucx-a$tag in ${NS_HOST[0]} (${ADDR_HOST[0]}), ucx-b$tag in ${NS_HOST[1]} (${ADDR_HOST[1]})"

export IDIST_TIMEOUT=30 IDIST_JOB_TOKEN=ucx$tag IDIST_INTERHOST=ucx UCX_TLS=tcp
port=29699
node() {  # node K NPROC PROGRAM ARGS...: idist-run as node K of 2
  local k=$1 n=$2
  shift 2
  on_host "$k" "ucx-$k$tag" "$RUN" ${NODE_FLAGS:-} --nnodes 2 --node-rank "$k" --master-addr "${ADDR_HOST[0]}" \
    --master-port $port -n "$n" "$@"
}

# two_nodes LABEL NPROC PROGRAM: PROGRAM on both hosts (bounded by 240 s); checks both exit 0
# and sets `all` to the ranks' output.
two_nodes() {
  local label=$1 n=$2 program=$3 b
  port=$((port + 1))
  node 1 "$n" "$program" >"$TMP/b" 2>&1 &
  b=$!
  timeout 240 bash -c "$(declare -f node on_host; declare -p NS_HOST ADDR_HOST); tag=$tag RUN=$RUN port=$port node 0 $n $program" >"$TMP/a" 2>&1
  check "$label: host A's node exits 0" equals $? 0
  wait $b
  check "$label: host B's node exits 0" equals $? 0
  all="$(cat "$TMP/a" "$TMP/b")"
  [ "$FAILED" -eq 0 ] || tail -n 20 "$TMP/a" "$TMP/b"
}

two_nodes "matrix, 2 ranks per host" 2 "$MATRIX"
echo "$all" | grep -E "checks|FAILED|backend:|rror" | head -n 12
check "matrix, 2 per host: 4 ranks report no failure" equals "$(count "$all" "checks, 0 failed")" 4
check "matrix, 2 per host: every rank runs ucx among the leaders" equals \
  "$(count "$all" "hierarchical: shared memory within each host, ucx among one leader per host")" 4

# This one with IDIST_INTERHOST=auto (UCX is usable on both hosts: auto picks it) and
# idist-run -v, which has the ranks say the choice.
IDIST_INTERHOST=auto NODE_FLAGS=-v two_nodes "matrix, 1 rank per host" 1 "$MATRIX"
echo "$all" | grep -E "checks|FAILED|backend:|rror|between hosts" | head -n 8
check "matrix, 1 per host: 2 ranks report no failure" equals "$(count "$all" "checks, 0 failed")" 2
check "matrix, 1 per host: ucx carries the world (chosen by IDIST_INTERHOST=auto)" equals \
  "$(count "$all" "backend: gloo (carried by ucx)")" 2
check "... and idist-run -v has the ranks say so" contains "$all" "between hosts (2 members under"

# by_hand PREFIX TIMEOUT ARGS...: ranks 0 (host A) and 1 (host B) started without idist-run, so
# that only the library stops the survivor; outputs in $TMP/PREFIX.r.
by_hand() {
  local prefix=$1 limit=$2 r
  shift 2
  port=$((port + 1))
  pids=()
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=${ADDR_HOST[0]} MASTER_PORT=$port IDIST_TIMEOUT=$limit \
      timeout 60 bash -c "$(declare -f on_host; declare -p NS_HOST); on_host $r ucx-$r$tag $MATRIX $*" \
      >"$TMP/$prefix.$r" 2>&1 &
    pids+=($!)
  done
}

# IDIST_DEBUG's cross-rank check, and a late rank's timeout, as on the other paths (matrix.cpp
# says what each rank must see).
export IDIST_DEBUG=1
by_hand mismatch 10 --mismatch
wait_codes "${pids[@]}"
unset IDIST_DEBUG
cat "$TMP"/mismatch.*
check "mismatch: both ranks raised twice and the group stayed usable" equals "${codes[*]}" "0 0"
by_hand hang 2 --hang
wait_codes "${pids[@]}"
cat "$TMP"/hang.*
check "hang: rank 0 named the late rank both times" equals "${codes[0]}" 0

# A host dies: rank 1 exits mid-run.
start=$(now_ms)
by_hand die 10 --die
wait_codes "${pids[@]}"
elapsed=$(($(now_ms) - start))
cat "$TMP"/die.*
check "die: the dead rank exited 9" equals "${codes[1]}" 9
check "die: rank 0 raised (exit 3)" equals "${codes[0]}" 3
check "die: rank 0 names rank 1 and ucx" test -n "$(grep -E 'rank 1' "$TMP/die.0" | grep ucx)"
check "die: the survivor was done well within the 10 s timeout: UCX saw the peer go ($elapsed ms)" test "$elapsed" -lt 5000

# Ranks in all_reduces of different sizes: both raise (exit 3) at once, not at the 10 s
# timeout, and one says so. sizes_differ PREFIX LABEL WHAT SAYS (an extended regex).
sizes_differ() {
  local prefix=$1 label=$2 what=$3 says=$4
  start=$(now_ms)
  by_hand "$prefix" 10 --sizes
  wait_codes "${pids[@]}"
  elapsed=$(($(now_ms) - start))
  cat "$TMP/$prefix".*
  check "$label, sizes differ: both ranks raised (exit 3)" equals "${codes[*]}" "3 3"
  check "$label, sizes differ: $what" test -n "$(grep -hE "$says" "$TMP/$prefix".*)"
  check "$label, sizes differ: at once, not at the 10 s timeout ($elapsed ms)" test "$elapsed" -lt 5000
}
# On UCX's tag path (messages below the lanes' 64 KiB): a shorter message than the receive
# completes as a success in UCX, so the backend checks each length, rather than one rank
# returning a wrong sum.
sizes_differ tag-sizes tags "a rank says the calls differ" 'the ranks called different collectives or sizes'

# A link is cut under all_reduce: host B's cable down at the bridge. cut_under PREFIX LABEL.
cut_under() {
  local prefix=$1 label=$2
  by_hand "$prefix" 5 --loop
  wait_for_lines "$TMP/$prefix.0" "looping" 1
  wait_for_lines "$TMP/$prefix.1" "looping" 1
  start=$(now_ms)
  netns_cut 1
  wait_codes "${pids[@]}"
  elapsed=$(($(now_ms) - start))
  cat "$TMP/$prefix".*
  check "$label: both ranks raised (exit 3)" equals "${codes[*]}" "3 3"
  check "$label: rank 0 names rank 1 and ucx" test -n "$(grep -E 'rank 1' "$TMP/$prefix.0" | grep ucx)"
  check "$label: rank 1 names rank 0 and ucx" test -n "$(grep -E 'rank 0' "$TMP/$prefix.1" | grep ucx)"
  # The deadline, then at most 2 s in which the runtime asks the store who is missing (runtime.cpp).
  check "$label: both were done within the 5 s timeout and the runtime's 2 s inquiry ($elapsed ms)" test "$elapsed" -lt 8000
}
cut_under cut cut

# Four ranks, 2 per host, started without idist-run so that only the library stops them:
# four_ranks PREFIX MODE VAR=VALUE... runs `matrix MODE` with the variables that choose the
# hierarchical path (the link brought up first: a cut above leaves it down).
four_ranks() {
  local prefix=$1 mode=$2
  shift 2
  ip -n "$NS_BRIDGE" link set "b1-$HOSTS_TAG" up
  port=$((port + 1))
  pids=()
  for r in 0 1 2 3; do
    env "$@" RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 MASTER_ADDR=${ADDR_HOST[0]} \
      MASTER_PORT=$port IDIST_TIMEOUT=5 \
      timeout 60 bash -c "$(declare -f on_host; declare -p NS_HOST); on_host $((r / 2)) ucx-$((r / 2))$tag $MATRIX $mode" \
      >"$TMP/$prefix.$r" 2>&1 &
    pids+=($!)
  done
}
# The link cut under all_reduce in segments (the leaders' thread carries segments across
# while their hosts reduce and broadcast the others), then by rails (each host's members
# carry a block each). Every rank raises (exit 3) within the timeout and the runtime's
# inquiry; none hangs.
cut_four() {
  local prefix=$1 label=$2
  shift 2
  four_ranks "$prefix" --loop "$@"
  for r in 0 1 2 3; do wait_for_lines "$TMP/$prefix.$r" "looping" 1; done
  start=$(now_ms)
  netns_cut 1
  wait_codes "${pids[@]}"
  elapsed=$(($(now_ms) - start))
  cat "$TMP/$prefix".*
  check "$label cut: every rank raised (exit 3)" equals "${codes[*]}" "3 3 3 3"
  check "$label cut: all were done within the 5 s timeout and the 2 s inquiry ($elapsed ms)" test "$elapsed" -lt 8000
}
cut_four seg segments IDIST_HIER_SEGMENT=500
cut_four rails rails IDIST_HIER_SEGMENT=0 IDIST_HIER_RAILS_FROM=500
# By rails, host A's second rank dies: its rail's other end (host B's second rank) loses it
# over ucx, its host's leader over shared memory, and host B's leader its own second rank.
start=$(now_ms)
four_ranks rails-die --die IDIST_HIER_SEGMENT=0 IDIST_HIER_RAILS_FROM=500
wait_codes "${pids[@]}"
elapsed=$(($(now_ms) - start))
cat "$TMP"/rails-die.*
check "rails, die: the dead rank exited 9, the others raised (exit 3)" equals "${codes[*]}" "3 9 3 3"
check "rails, die: its rail's other end names rank 1 and ucx" test -n "$(grep -E 'rank 1' "$TMP/rails-die.3" | grep ucx)"
check "rails, die: all were done within the 5 s timeout ($elapsed ms)" test "$elapsed" -lt 5000
# By rails, host A's second rank is frozen (SIGSTOP): nothing tells the others, so each
# raises at the 5 s deadline and the runtime's inquiry; none hangs and none exits 0.
matrix_under() {  # matrix_under PID: the matrix process below PID (timeout, bash, nsenter...)
  local child found
  for child in $(ps -o pid= --ppid "$1"); do
    [ "$(cat /proc/"$child"/comm 2>/dev/null)" = matrix ] && { echo "$child"; return; }
    found=$(matrix_under "$child") && [ -n "$found" ] && { echo "$found"; return; }
  done
  return 1
}
four_ranks rails-stop --loop IDIST_HIER_SEGMENT=0 IDIST_HIER_RAILS_FROM=500
for r in 0 1 2 3; do wait_for_lines "$TMP/rails-stop.$r" "looping" 1; done
frozen=$(matrix_under "${pids[1]}")
check "rails, frozen: rank 1's process found" test -n "$frozen"
start=$(now_ms)
kill -STOP "$frozen"
wait_codes "${pids[0]}" "${pids[2]}" "${pids[3]}"
elapsed=$(($(now_ms) - start))
kill -KILL "$frozen"
wait "${pids[1]}"
cat "$TMP"/rails-stop.*
check "rails, frozen: the other three raised (exit 3)" equals "${codes[*]}" "3 3 3"
check "rails, frozen: its host's leader names rank 1" test -n "$(grep -E 'rank 0 raised.*rank 1' "$TMP/rails-stop.0")"
check "rails, frozen: its rail's other end names rank 1" test -n "$(grep -E 'rank 3 raised.*rank 1' "$TMP/rails-stop.3")"
check "rails, frozen: all were done within the 5 s timeout and the 2 s inquiry ($elapsed ms)" test "$elapsed" -lt 8000

# The same faults with every collective message on the TCP lanes (IDIST_UCX_TCP_FROM=1; by
# default only those of 64 KiB or more take them, and the messages above are smaller).
export IDIST_UCX_TCP_FROM=1
ip -n "$NS_BRIDGE" link set "b1-$HOSTS_TAG" up
two_nodes "matrix on the lanes, 1 rank per host" 1 "$MATRIX"
check "lanes: the matrix, 2 ranks report no failure" equals "$(count "$all" "checks, 0 failed")" 2
start=$(now_ms)
by_hand lane-die 10 --die
wait_codes "${pids[@]}"
elapsed=$(($(now_ms) - start))
cat "$TMP"/lane-die.*
check "lanes, die: rank 0 raised (exit 3)" equals "${codes[0]}" 3
check "lanes, die: rank 0 names rank 1 and ucx" test -n "$(grep -E 'rank 1' "$TMP/lane-die.0" | grep ucx)"
check "lanes, die: the survivor was done well within the 10 s timeout ($elapsed ms)" test "$elapsed" -lt 5000
# Sizes that differ without IDIST_DEBUG's check: each rank's lane reads the other's header,
# so both raise at once, naming the other, rather than waiting for the timeout or mixing bytes.
# The first to read the other's header says what came; the other may instead see that rank
# leave (its exit resets the connection) and say so.
sizes_differ lane-sizes lanes "a rank says what came" '(20 bytes came where 16|16 bytes came where 20) were expected'
cut_under lane-cut "lanes, cut"
# Hosts that disagree on IDIST_UCX_TCP_FROM would put a message on a lane while the other end
# waits for it over UCX: init refuses on both, naming the setting and both values.
ip -n "$NS_BRIDGE" link set "b1-$HOSTS_TAG" up
port=$((port + 1))
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=${ADDR_HOST[0]} MASTER_PORT=$port IDIST_TIMEOUT=10 \
    IDIST_UCX_TCP_FROM=$((r == 0 ? 65536 : 1)) \
    timeout 60 bash -c "$(declare -f on_host; declare -p NS_HOST); on_host $r ucx-$r$tag $MATRIX --quick" \
    >"$TMP/lane-from.$r" 2>&1 &
  pids+=($!)
done
wait_codes "${pids[@]}"
cat "$TMP"/lane-from.*
check "lanes, IDIST_UCX_TCP_FROM differs: both ranks refuse (exit 1)" equals "${codes[*]}" "1 1"
for r in 0 1; do
  check "lanes, IDIST_UCX_TCP_FROM differs: rank $r names the setting and both values" \
    contains "$(cat "$TMP/lane-from.$r")" "ranks disagree on IDIST_UCX_TCP_FROM: 1 on rank 1 but 65536 on rank 0"
done
unset IDIST_UCX_TCP_FROM

finish
