#!/bin/bash
# Straggler reports (issue 47): a 4-rank job whose steps take 100 ms of the ranks' own work (10
# of spinning, 90 of sleep: light on 2 cores); from step 10, rank 2's takes 30% longer. It is
# named once, within 7 steps (4 slow steps, a reading, the console's order of rank 0's lines and
# idist-run's), and a healthy run names nobody at a 25% threshold. These margins
# hold on a CI machine busy with other tests; the issue's own targets (10% within 10 steps, 20%
# within 5, no report in 5 minutes at the default 10%) are bench/straggler.sh's, on a quiet one.
# Then the cause: two ranks computing, a busy loop pinned beside rank 1, which is named with its
# cpu shared.
# usage: straggler.sh IDIST_RUN METRICS_RANK
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
private_copy metrics_rank "$2"  # $PROG: a test beside this one running metrics_rank is not ours to stop
HOG=
trap 'kill $HOG 2>/dev/null; pkill -9 -f "^$PROG " 2>/dev/null; netns_cleanup; rm -rf "$DIR"' EXIT
cd "$DIR" || exit 1
export OMP_NUM_THREADS=1 METRICS_RANK_SLEEP_MS=90 METRICS_RANK_PROGRESS=1

# The steps rank 0 had printed after SINCE when idist-run's straggler line came (both reach the
# console in the order they were written, within a read of the ranks' pipes).
named_after() { awk -v since="$2" '/^step /{s=$2} /straggler: rank/{print s - since; exit}' "$1"; }

"$RUN" -n 4 "$PROG" 40 10 2 30 10 >slow 2>&1
rc=$?
at=$(named_after slow 10)
check "a rank 30% slower from step 10 is named within 7 steps (${at:-never}), once, and the job goes on (exit $rc)" \
  eval '[ $rc = 0 ] && [ -n "$at" ] && [ "$at" -ge 0 ] && [ "$at" -le 7 ] && [ "$(grep -c "straggler: rank" slow)" = 1 ] &&
        grep -q "straggler: rank 2 (.*) takes [0-9]*% longer than the median between collectives over the last [0-9]* steps" slow' ||
  grep -v "^step" slow | tail -5
grep -h "straggler:" slow | sed 's/^/# /'

"$RUN" -n 4 --straggler-threshold 25 "$PROG" 200 10 >healthy 2>&1
rc=$?
check "a healthy 4-rank job of 200 steps names nobody at --straggler-threshold 25 (exit $rc)" \
  eval '[ $rc = 0 ] && ! grep -q "straggler" healthy' || grep "straggler" healthy
check "--straggler-threshold 0: never, even for a rank 30% slower" \
  eval '"$RUN" -n 4 --straggler-threshold 0 "$PROG" 20 10 2 30 >off 2>&1 && ! grep -q straggler off'

# The cause: two ranks doing a fixed amount of arithmetic, each on a cpu of its own, and a busy
# loop on rank 1's: its steps take about twice as long, waiting for the cpu.
if [ "$(getconf _NPROCESSORS_ONLN)" -ge 2 ]; then
  METRICS_RANK_COMPUTE=1 METRICS_RANK_SLEEP_MS=0 "$RUN" -n 2 --no-bind "$PROG" 0 20 >shared 2>&1 &
  job=$!
  for _ in $(seq 100); do [ -n "$(rank_pid "$PROG" 1)" ] && break; sleep 0.1; done
  taskset -pc 0 "$(rank_pid "$PROG" 0)" >/dev/null
  taskset -pc 1 "$(rank_pid "$PROG" 1)" >/dev/null
  taskset -c 1 sh -c 'while :; do :; done' &
  HOG=$!
  wait_for_line shared "straggler: rank 1" 30
  kill $HOG
  touch stop
  wait $job
  rc=$?
  check "a rank beside a busy loop on its cpu is named (exit $rc)" \
    eval '[ $rc = 0 ] && grep -q "straggler: rank 1 (.*) takes " shared' || grep -v "^step" shared | tail -5
  # The cause is said where the rank waited for its cpu far more than the others did: on a machine
  # busy with other tests, rank 0 waits for one too.
  if [ "$(awk '{print int($1)}' /proc/loadavg)" -lt 2 ]; then
    check "... with the cause: its cpu is shared" \
      grep -q "straggler: rank 1 (.*) takes .*; its cpu is shared: it waited for one [0-9]*% as long as it ran" shared
  else
    echo "SKIP: the cause's check: the machine is busy (load $(cut -d' ' -f1 /proc/loadavg)), so rank 0 waits for a cpu too"
  fi
  grep -h "straggler:" shared | sed 's/^/# /'
else
  echo "SKIP: the shared-cpu case needs 2 cpus"
fi

# Job-wide: two namespace hosts with one rank each, which no node can compare alone; the
# rendezvous compares them, and both nodes say rank 1 (host B) is slow.
if netns_pair $$; then
  port=$(random_port)
  export IDIST_TIMEOUT=30 IDIST_JOB_TOKEN=straggler$$
  ip netns exec "$NS_B" "$RUN" --nnodes 2 --node-rank 1 --master-addr "$ADDR_A" --master-port "$port" -n 1 \
    "$PROG" 40 10 1 30 10 >b.out 2>&1 &
  node_b=$!
  timeout 120 ip netns exec "$NS_A" "$RUN" --nnodes 2 --node-rank 0 --master-addr "$ADDR_A" --master-port "$port" -n 1 \
    "$PROG" 40 10 1 30 10 >a.out 2>&1
  rc_a=$?
  wait $node_b
  rc_b=$?
  check "two hosts, one rank each: rank 1 30% slower is named by the rendezvous, on both nodes (exit $rc_a, $rc_b)" \
    eval '[ $rc_a = 0 ] && [ $rc_b = 0 ] && [ "$(grep -c "straggler: rank 1 (" a.out)" = 1 ] &&
          [ "$(grep -c "straggler: rank 1 (" b.out)" = 1 ] && ! grep -q "straggler: rank 0" a.out' ||
    grep -h "straggler\|error" a.out b.out
  grep -h "straggler:" a.out | sed 's/^/# /'
  netns_cleanup
else
  echo "SKIP (two hosts): cannot create network namespaces here (needs root, iproute2, CAP_NET_ADMIN)"
fi
finish
