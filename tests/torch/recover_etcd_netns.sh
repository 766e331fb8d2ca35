#!/bin/bash
# idist::Recovery on the etcd rendezvous (issue 46): two network-namespace hosts, 2 ranks each,
# etcd in a third. The MLP with dropout (recover_check) with node 0 killed whole (its idist-run,
# its ranks with it, and it proposes: it started first): host 1 ends with exit 0 in one attempt,
# its ranks re-formed in place, one step redone, every sample once, and parameters bit for
# bit those of checkpoint restarts at the step the re-form went on from.
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
  on_host "$i" "${NAMES[i]}" timeout 240 "$RUN" --rdzv-backend etcd --nnodes 2 --rdzv-endpoint "$EP" \
    --rdzv-id "recover-etcd-$tag-$job" -n "$n" --grace 1 "$@" >"h$i.out" 2>&1 &
}

on 0 2 "$CHECK" ck 32 --recover --pause-ms 25 --progress
sleep 0.3  # host 0 first: it proposes, and its idist-run is node 0
on 1 2 "$CHECK" ck 32 --recover --pause-ms 25 --progress
for i in $(seq 1500); do grep -q "^step 8$" h0.out && break; sleep 0.01; done
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
finish
