#!/bin/bash
# Three "hosts" (network namespaces on one bridge, each with a host name of its own) that meet
# at a rendezvous on host 0: nodes started in any order without --node-rank get the same ranks
# every time; a cut cable (no reset, no FIN) is noticed within the default node_timeout (5 s) on
# both sides, and with --nnodes 2:3 the other two go on without the cut host.
# usage: rendezvous_netns.sh IDIST_RUN EXAMPLES_DIR JOB_SUM     exits 77 (skipped) without namespaces
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
JOB_SUM=$(realpath "$3")
DIR=$(mktemp -d /tmp/idist-rdzv-netns.XXXXXX)
tag=$$
cleanup() {
  pkill -9 -f "rdzv-id netns-$tag" 2>/dev/null
  netns_hosts_cleanup
  rm -rf "$DIR"
}
trap cleanup EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 3; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root, iproute2, unshare, CAP_NET_ADMIN)"
  exit 77
fi
export IDIST_TIMEOUT=30
# Host 0 hosts the rendezvous (node 0); the others are ranked by host name: mike, then zulu.
NAMES=(alpha zulu mike)
EP=${ADDR_HOST[0]}:29400
echo "# hosts ${NAMES[*]} at ${ADDR_HOST[*]}, rendezvous at $EP"

# start I NNODES [idist-run options...] -- [job_sum args]: host I's idist-run in the background;
# output in $DIR/hI.out, exit code in $DIR/hI.rc.
start() {
  local i=$1 nnodes=$2
  shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  rm -f "$DIR/h$i.rc"
  (on_host "$i" "${NAMES[i]}" timeout 60 "$RUN" --nnodes "$nnodes" --rdzv-endpoint "$EP" --rdzv-id "netns-$tag" -n 2 \
     "${opts[@]}" "$JOB_SUM" "$@" >"$DIR/h$i.out" 2>&1
   echo $? >"$DIR/h$i.rc") &
}
rc() { cat "$DIR/h$1.rc"; }
out() { cat "$DIR/h$1.out"; }
ranks_of() { grep -oE 'rank [0-9]+/6' "$DIR/h$1.out" | sort | tr '\n' ' '; }

# --- any start order, the same ranks ---------------------------------------------------------------
for order in "2 1 0" "1 0 2" "0 2 1"; do
  for i in $order; do
    start "$i" 3 -- 5 10 5
    sleep 0.3
  done
  wait
  check "started in the order $order (host 0 hosts): every node exits 0" equals "$(rc 0)/$(rc 1)/$(rc 2)" 0/0/0
  check "... alpha (host 0) runs ranks 0-1, mike 2-3, zulu 4-5, whatever the order" \
    equals "$(ranks_of 0)|$(ranks_of 2)|$(ranks_of 1)" "rank 0/6 rank 1/6 |rank 2/6 rank 3/6 |rank 4/6 rank 5/6 "
  check "... every sum right" equals "$(count "$(out 0; out 1; out 2)" "sum 105 right")" 6
done

# --- a cut cable -------------------------------------------------------------------------------
# mike (host 2, node 1) loses its cable while every rank computes. The rendezvous hears nothing
# more from it (no reset reaches anyone) and drops it after node_timeout; mike's idist-run hears
# nothing from the rendezvous and gives up as long after. With 2:3 the other two go on. The
# default node_timeout and heartbeat (5 s, 1 s): each side checks the other's silence at its
# deadline, so the cut is noticed at most 5 s after it (the last heartbeat came before it).
conf=(--rdzv-conf last_call_timeout=0.5 --max-restarts 1 --grace 1)
start 0 2:3 "${conf[@]}" -- 120 25 5
sleep 0.3
start 1 2:3 "${conf[@]}" -- 120 25 5
start 2 2:3 "${conf[@]}" -- 120 25 5
sleep 2
netns_cut 2
cut=$(now_ms)
seen_0= seen_2=
while { [ -z "$seen_0" ] || [ -z "$seen_2" ] || [ ! -s "$DIR/h2.rc" ]; } && [ $(($(now_ms) - cut)) -lt 20000 ]; do
  [ -z "$seen_0" ] && grep -q "stopped answering" "$DIR/h0.out" && seen_0=$(($(now_ms) - cut))
  [ -z "$seen_2" ] && grep -q "lost the rendezvous" "$DIR/h2.out" && seen_2=$(($(now_ms) - cut))
  sleep 0.05
done
took=$(($(now_ms) - cut))
wait
check "the surviving side (the rendezvous on alpha) notices the cut in ${seen_0:-more than 20000} ms (default node_timeout 5 s: at most 5500)" \
  eval '[ -n "$seen_0" ] && [ "$seen_0" -le 5500 ]'
check "the cut host notices in ${seen_2:-more than 20000} ms (at most 5500) and its idist-run exits 1 in $took ms (+ grace 1 s: under 7000)" \
  eval '[ -n "$seen_2" ] && [ "$seen_2" -le 5500 ] && [ "$(rc 2)" = 1 ] && [ $took -lt 7000 ]'
check "... naming the rendezvous that went silent" contains "$(out 2)" \
  "lost the rendezvous at $EP (node 0): stopped answering (no heartbeat for 5s)"
check "the other two exit 0" equals "$(rc 0)/$(rc 1)" 0/0
check "... after the rendezvous dropped mike for its silence" contains "$(out 0)" \
  "attempt 0 ended: node 1 (mike) stopped answering (no heartbeat for 5s); restarting every node"
check "... and re-formed without it: 4 ranks of attempt 1 sum 50" \
  equals "$(grep -cE 'rank [0-3]/4 port [0-9]+ attempt 1 sum 50 right' <<<"$(out 0; out 1)")" 4

# --- a cut link while every rank waits in a collective: the stall reports ----------------------
# alpha and zulu, 2 + 2 ranks in a loop of all_reduces; zulu's cable is cut. Within the stall
# timeout (2 s) plus 5 s each node says every rank there waits in the same collective, so the
# network or the backend holds it; the job-wide report on alpha says zulu did not answer. (The
# nodes' silence bound is raised to 12 s so that the reports come before the rendezvous drops
# zulu, which then ends the job.)
conf=(--stall-timeout 2 --rdzv-conf node_timeout=12 --grace 1)
start 0 2 "${conf[@]}" -- 100000 1 5
sleep 0.3
start 1 2 "${conf[@]}" -- 100000 1 5
for i in $(seq 200); do grep -q "attempt 0" "$DIR/h1.out" 2>/dev/null && break; sleep 0.05; done
sleep 1.5
netns_cut 1
cut=$(now_ms)
seen_0= seen_1= seen_job=
while { [ -z "$seen_0" ] || [ -z "$seen_1" ] || [ -z "$seen_job" ]; } && [ $(($(now_ms) - cut)) -lt 15000 ]; do
  # "every rank here entered it", or (cut mid-call) one rank past it: a stall either way.
  [ -z "$seen_0" ] && grep -q "^idist-run: stall: [a-z_]* #" "$DIR/h0.out" && seen_0=$(($(now_ms) - cut))
  [ -z "$seen_1" ] && grep -q "^idist-run: stall: [a-z_]* #" "$DIR/h1.out" && seen_1=$(($(now_ms) - cut))
  [ -z "$seen_job" ] && grep -q "stall (job-wide): node 1 (zulu) did not answer" "$DIR/h0.out" && seen_job=$(($(now_ms) - cut))
  sleep 0.05
done
wait
grep -h "stall" "$DIR/h0.out" "$DIR/h1.out" | grep -v "stall:   |" | sed 's/^/  | /'
check "a cut link: alpha reports its ranks stalled in a collective, after ${seen_0:-more than 15000} ms (stall timeout 2 s + 5 s: at most 7000)" \
  eval '[ -n "$seen_0" ] && [ "$seen_0" -le 7000 ]'
check "... and so does zulu, on its side of the cut, after ${seen_1:-more than 15000} ms (at most 7000)" \
  eval '[ -n "$seen_1" ] && [ "$seen_1" -le 7000 ]'
check "... alpha's job-wide report says zulu did not answer, after ${seen_job:-more than 15000} ms (at most 7000)" \
  eval '[ -n "$seen_job" ] && [ "$seen_job" -le 7000 ]'
check "... and the job fails on both nodes ($(rc 0)/$(rc 1))" eval '[ "$(rc 0)" != 0 ] && [ "$(rc 1)" != 0 ]'

finish
