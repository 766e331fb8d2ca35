#!/bin/bash
# --trace FILE (issue 47): the ranks' collectives as a Chrome/Perfetto trace, checked against the
# Trace Event format by trace_check.py (phases, timestamps monotonic on each track, one track per
# rank, nodes as processes, arrows paired) and against the job: every call there, the slow rank
# the one waited for. On one host, then over two network-namespace hosts (node 0 merges node 1's
# part), then a job stopped by --timeout, one with a rank killed and one with a rank frozen,
# then bad input.
# usage: trace.sh IDIST_RUN METRICS_RANK EXAMPLES_DIR
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
EXAMPLES=$(realpath "$3")
CHECK="/usr/bin/python3 $(dirname "$(realpath "$0")")/trace_check.py"
private_copy metrics_rank "$2"  # $PROG: a test beside this one running metrics_rank is not ours to stop
trap 'pkill -9 -f "^$PROG " 2>/dev/null; netns_cleanup; rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1
export OMP_NUM_THREADS=1

# One host: 40 steps of 1 ms of spinning and 10 of sleep (light on 2 busy cores), each a 256 KiB
# and an 8-byte all_reduce; from step 10 rank 2's work takes twice as long.
export METRICS_RANK_SLEEP_MS=10
"$RUN" -n 4 --trace one.json "$PROG" 40 1 2 100 10 >one.out 2>&1
rc=$?
check "4 ranks: the trace is written and said (exit $rc)" \
  eval '[ $rc = 0 ] && grep -q "trace: 4 ranks on 1 node, 320 calls, in one.json (open it in ui.perfetto.dev)" one.out' ||
  tail -3 one.out
check "... in the Trace Event format, one track per rank, every call, rank 2 the one waited for" \
  $CHECK one.json --ranks 0,1,2,3 --calls 80 --slow 2 --steps 40

# Two hosts, 2 ranks each, rank 3 (host B) twice as slow from step 10; the same path on both (one
# filesystem): node 1 writes its part, node 0 merges it.
if netns_pair $$; then
  port=$(random_port)
  export IDIST_TIMEOUT=30 IDIST_JOB_TOKEN=trace$$
  ip netns exec "$NS_B" "$RUN" --nnodes 2 --node-rank 1 --master-addr "$ADDR_A" --master-port "$port" -n 2 \
    --trace two.json "$PROG" 40 1 3 100 10 >b.out 2>&1 &
  node_b=$!
  timeout 120 ip netns exec "$NS_A" "$RUN" --nnodes 2 --node-rank 0 --master-addr "$ADDR_A" --master-port "$port" -n 2 \
    --trace two.json "$PROG" 40 1 3 100 10 >a.out 2>&1
  rc_a=$?
  wait $node_b
  rc_b=$?
  check "two hosts: both exit 0 ($rc_a, $rc_b); node 1 writes its part, node 0 merges it into one file" \
    eval '[ $rc_a = 0 ] && [ $rc_b = 0 ] && grep -q "trace: this node.s 2 ranks (160 calls) in two.json.node1" b.out &&
          grep -q "trace: 4 ranks on 2 nodes, 320 calls, in two.json" a.out && [ ! -e two.json.node1 ]' ||
    tail -3 a.out b.out
  check "... nodes as processes, one track per rank, rank 3 (on the other host) the one waited for" \
    $CHECK two.json --ranks 0,1,2,3 --nodes 0,1 --calls 80 --slow 3 --steps 40
  netns_cleanup
else
  echo "SKIP (two hosts): cannot create network namespaces here (needs root, iproute2, CAP_NET_ADMIN)"
fi

# A job that never ends on its own (STEPS 0), stopped by --timeout: the trace still comes, whole.
"$RUN" -n 2 --timeout 3 --trace stopped.json "$PROG" 0 5 >stopped.out 2>&1
rc=$?
check "a job stopped by --timeout (exit $rc) still writes its trace" \
  eval '[ $rc = 124 ] && grep -q "trace: 2 ranks on 1 node, [0-9]* calls, in stopped.json" stopped.out' || tail -3 stopped.out
check "... in the format" $CHECK stopped.json --ranks 0,1 --partial

# The messy cases: a rank killed mid-job (the job fails at once), and one frozen (SIGSTOP) until
# --timeout stops the job; either way the trace comes, its last calls open or failed.
"$RUN" -n 3 --trace killed.json "$PROG" 0 5 >killed.out 2>&1 &
job=$!
sleep 2
kill -9 "$(rank_pid "$PROG" 1)"
wait $job
rc=$?
check "a rank killed mid-job: the job fails (exit $rc), and its trace is written, in the format" \
  eval '[ $rc != 0 ] && grep -q "trace: 3 ranks on 1 node, [0-9]* calls, in killed.json" killed.out &&
        $CHECK killed.json --ranks 0,1,2 --partial' || tail -3 killed.out
"$RUN" -n 3 --timeout 4 --trace frozen.json "$PROG" 0 5 >frozen.out 2>&1 &
job=$!
sleep 2
kill -STOP "$(rank_pid "$PROG" 2)"
wait $job
rc=$?
check "a rank frozen until --timeout (exit $rc): its trace is written, in the format" \
  eval '[ $rc = 124 ] && grep -q "trace: 3 ranks on 1 node, [0-9]* calls, in frozen.json" frozen.out &&
        $CHECK frozen.json --ranks 0,1,2 --partial' || tail -3 frozen.out

# Point-to-point calls that overlap (an isend beside an irecv) on lanes of their own: slices nest.
"$RUN" -n 2 --trace p2p.json "$EXAMPLES/isend_irecv" >p2p.out 2>&1
rc=$?
check "isend and irecv (exit $rc): on named tracks, every slice nested" \
  eval '[ $rc = 0 ] && $CHECK p2p.json --ranks 0,1 && grep -q "send/recv" p2p.json' || tail -3 p2p.out

# Bad input: one line naming --trace, non-zero, before any rank starts.
out=$("$RUN" -n 2 --trace /nonexistent/dir/t.json "$PROG" 5 1 2>&1)
rc=$?
check "--trace in a directory that does not exist: refused in one line (exit $rc)" \
  eval '[ $rc != 0 ] && [ "$(wc -l <<<"$out")" = 1 ] && contains "$out" "--trace /nonexistent/dir/t.json: no directory /nonexistent/dir"' ||
  echo "$out"
out=$("$RUN" -n 2 --trace "$DIR" "$PROG" 5 1 2>&1)
rc=$?
check "--trace naming a directory: refused in one line (exit $rc)" \
  eval '[ $rc != 0 ] && [ "$(wc -l <<<"$out")" = 1 ] && contains "$out" "is a directory; give a file name"' || echo "$out"

finish
