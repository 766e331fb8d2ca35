#!/bin/bash
# idist::Recovery on the etcd rendezvous (issue 46): two network-namespace hosts, 2 ranks each,
# etcd in a third. The MLP with dropout (recover_check) with node 0 killed whole (its idist-run,
# its ranks with it, and it proposes: it started first): host 1 ends with exit 0 in one attempt,
# its ranks re-formed in place, one step redone, every sample once, and parameters bit for
# bit those of checkpoint restarts at the step the re-form went on from. Then a replacement
# (--max-restarts), granted by the proposer and started on the lost rank's host, admitted live.
# usage: recover_etcd_netns.sh IDIST_RUN EXAMPLES_DIR RECOVER_CHECK     exits 77 (skipped) without namespaces or etcd
source "$(dirname "$0")/../e2e/lib.sh"
recover_programs "$@"
skip_without_etcd
tag=$$
ETCD_PID=
trap 'kill -9 $ETCD_PID 2>/dev/null; pkill -9 -f "rdzv-id recover-etcd-$tag" 2>/dev/null; pkill -9 -f "^$CHECK " 2>/dev/null; netns_hosts_cleanup; rm -rf "$DIR"' EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 3; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root, iproute2, unshare, CAP_NET_ADMIN)"
  exit 77
fi
export OMP_NUM_THREADS=1 IDIST_TIMEOUT=60
NAMES=(alpha bravo)
check "etcd is up on host 2" netns_etcd 2
EP=$ETCD_EP

# on I N PROGRAM ARGS...: host I's idist-run of N ranks on etcd, in the background, output in hI.out.
job=0
on() {
  local i=$1 n=$2
  shift 2
  : >"h$i.out"  # now, not in the background: a wait for its lines must not read the last job's
  on_host "$i" "${NAMES[i]}" timeout 240 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "$EP" \
    --rdzv-id "recover-etcd-$tag-$job" -n "$n" --grace 1 "$@" >"h$i.out" 2>&1 &
}

on 0 2 "$CHECK" ck 32 --recover --pause-ms 25 --progress
sleep 0.3  # host 0 first: it proposes, and its idist-run is node 0
on 1 2 "$CHECK" ck 32 --recover --pause-ms 25 --progress
wait_for_line h0.out "^step 8$"
kill -9 "$(idist_run_on_host 0 "rdzv-id recover-etcd-$tag-$job ")"
wait
check "etcd: MLP with dropout, node 0 killed whole: host 1 ends with exit 0" \
  grep -qE "succeeded after 1 re-form \(node 0 \(alpha\) was lost: its idist-run ended or was killed .*; world 4 -> 2\)" h1.out ||
  tail -5 h1.out
check "... every step done, one redone, every sample once" grep -q "^recover_check: done steps=32 redone=1 resumed_from=0 seen=2048 " h1.out ||
  grep done h1.out
check "... re-formed in place (generation 1, from step 0 of attempt 0: no restart)" grep -q "^recovered: generation 1 world 2 " h1.out
at=$(grep "^recovered: generation 1 " h1.out | grep -o "after_step [0-9]*" | head -1 | awk '{print $2}')
mine=$(grep -o "params=.*" h1.out)
job=$((job + 1))
IDIST_INTERHOST=gloo on 0 2 "$CHECK" refck "$at"
IDIST_INTERHOST=gloo on 1 2 "$CHECK" refck "$at"
wait
"$RUN" -n 2 "$CHECK" refck 32 >ref.out 2>&1
theirs=$(grep "^recover_check: done" ref.out | grep -o "params=.*")
check "... $mine, bit for bit those of 2 + 2 ranks to step $at, then 2 on host 1's layout" \
  eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]' || tail -3 ref.out h0.out h1.out

# A replacement on etcd: rank 3 (host 1) killed at step 8; the proposer grants rank 4 from the
# job's budget, host 1's idist-run starts it, and once both nodes' ranks joined generation 1 it
# is admitted in generation 2 (world 4 -> 3 -> 4), laid out on host 1: bit for bit the
# checkpoint restarts at 2 + 2, 2 + 1, then 2 + 2 ranks.
rm -rf ck refck
job=$((job + 1))
on 0 2 --max-restarts 1 "$CHECK" ck 48 --recover --pause-ms 60 --progress
sleep 0.3
on 1 2 --max-restarts 1 "$CHECK" ck 48 --recover --pause-ms 60 --progress
wait_for_line h0.out "^step 8$"
survivors=$(for r in 0 1 2; do rank_pid "$CHECK" $r; done | sort | tr '\n' ' ')
kill -9 "$(rank_pid "$CHECK" 3)"
wait_for_line h0.out "^recovered: generation 2 "
still=$(for p in $survivors; do [ -d /proc/$p ] && echo "$p"; done | tr '\n' ' ')
wait
cat h0.out h1.out >out
check "etcd: a replacement on host 1 for its lost rank 3: both hosts end with exit 0" \
  eval 'grep -q "succeeded after 2 re-forms" h0.out && grep -q "succeeded after 2 re-forms" h1.out' || tail -n 5 h0.out h1.out
check "... rank 4 started in rank 3's place on host 1, admitted: world 4 -> 3 -> 4" \
  eval 'grep -q "rank 4 (pid [0-9]*) starts in rank 3.s place" h1.out && grep -q "^recovered: generation 2 world 4 after_step" h0.out' ||
  grep -h "place\|^recovered\|generation" out
check "... the survivors kept their processes ($still)" eval '[ -n "$survivors" ] && [ "$still" = "$survivors" ]'
check "... every step done, one redone, every sample once" \
  grep -q "^recover_check: done steps=48 redone=1 resumed_from=0 seen=3072 " out || grep done out
first=$(grep "^recovered: generation 1 " h0.out | grep -o "after_step [0-9]*" | awk '{print $2}')
second=$(grep "^recovered: generation 2 " h0.out | grep -o "after_step [0-9]*" | awk '{print $2}')
mine=$(grep -o "params=.*" out)
for spec in "2 $first" "1 $second" "2 48"; do
  set -- $spec
  job=$((job + 1))
  IDIST_INTERHOST=gloo on 0 2 "$CHECK" refck "$2"
  IDIST_INTERHOST=gloo on 1 "$1" "$CHECK" refck "$2"
  wait
done
theirs=$(grep -h "^recover_check: done" h0.out h1.out | grep -o "params=.*" | head -1)
check "... $mine, bit for bit those of 2 + 2 ranks to step $first, 2 + 1 to step $second, then 2 + 2" \
  eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]' || tail -n 3 h0.out h1.out
next_job() { job=$((job + 1)); }
one_rank_node_replacement next_job on "etcd: "
finish
