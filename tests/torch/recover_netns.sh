#!/bin/bash
# idist::Recovery over two hosts (issue 46): network namespaces on one bridge, 2 ranks each, on
# the built-in rendezvous. train_cifar10 --recover (a small ResNet-18) with rank 3 of host 1
# killed mid-epoch, and the MLP with dropout (recover_check) with the whole of host 1 killed (its
# idist-run, its ranks with it): host 0 ends with exit 0 in one attempt, one step redone, every
# sample once, and parameters bit for bit those of checkpoint restarts at the step the re-form
# went on from, on the same hosts: 2 + 2 ranks to that step, then the survivors' layout. Then
# replacements (--max-restarts) started on the lost rank's host, admitted live, and one that the
# job's end leaves unadmitted. The references run with IDIST_INTERHOST=gloo, as live recovery
# does (UCX cannot abort a lost peer's connections), since UCX's rails between hosts add in
# another order.
# usage: recover_netns.sh IDIST_RUN EXAMPLES_DIR RECOVER_CHECK     exits 77 (skipped) without namespaces
source "$(dirname "$0")/../e2e/lib.sh"
recover_programs "$@"
tag=$$
trap 'pkill -9 -f "rdzv-id recover-$tag" 2>/dev/null; pkill -9 -f "^$PROG " 2>/dev/null; pkill -9 -f "^$CHECK " 2>/dev/null; netns_hosts_cleanup; rm -rf "$DIR"' EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 2; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root, iproute2, unshare, CAP_NET_ADMIN)"
  exit 77
fi
export OMP_NUM_THREADS=1 IDIST_TIMEOUT=60
NAMES=(alpha bravo)
port=29600
small=(--width 8 --samples 1024 --batch-size 32 --epochs 2 --learning-rate 0.01 --log-every 4)

# on I N PROGRAM ARGS...: host I's idist-run of N ranks, in the background, output in hI.out;
# every call is a job of its own (a fresh rendezvous port), $agent_I its pid.
job() { port=$((port + 1)); }
on() {
  local i=$1 n=$2
  shift 2
  : >"h$i.out"  # now, not in the background: a wait for its lines must not read the last job's
  on_host "$i" "${NAMES[i]}" timeout 240 "$RUN" --nnodes 2 --node-rank "$i" --rdzv-endpoint "${ADDR_HOST[0]}:$port" \
    --rdzv-id "recover-$tag-$port" -n "$n" --grace 1 "$@" >"h$i.out" 2>&1 &
  eval "agent_$i=$!"
}
# both N0 N1 PROGRAM ARGS...: a job of N0 ranks on host 0 and N1 on host 1, to its end.
both() {
  local n0=$1 n1=$2
  shift 2
  job
  on 0 "$n0" "$@"
  on 1 "$n1" "$@"
  wait
}
idist_run_of() { pgrep -o -f "^$RUN --nnodes 2 --node-rank $1 --rdzv-endpoint ${ADDR_HOST[0]}:$port"; }

# train_cifar10: rank 3 (host 1) killed in epoch 1's 12th iteration.
rm -rf ck ref
job
on 0 2 "$PROG" --recover "${small[@]}" --output-path ck
on 1 2 "$PROG" --recover "${small[@]}" --output-path ck
wait_for_line h0.out "Iteration\[12/"
kill -9 "$(rank_pid "$PROG" 3)"
wait
cat h0.out h1.out >out
check "train_cifar10, kill -9 of rank 3 (host 1) of 2 + 2: both hosts end with exit 0" \
  grep -q "succeeded after 1 re-form (rank 3 on node 1 (bravo) was killed by SIGKILL; world 4 -> 3)" h1.out || tail -5 out
check "... host 0 too, in one attempt" grep -q "succeeded after 1 re-form" h0.out
check "... every step done, one redone, every sample once" grep -q "^train_cifar10: done steps=64 redone=1 resumed_from=0 seen=2048 " out ||
  grep done out
at=$(grep -o "after step [0-9]*" out | head -1 | awk '{print $3}')
mine=$(grep -o "params=.*" out)
IDIST_INTERHOST=gloo both 2 2 "$PROG" "${small[@]}" --steps "$at" --output-path ref
IDIST_INTERHOST=gloo both 2 1 "$PROG" "${small[@]}" --output-path ref
theirs=$(grep -h "resumed_from=$at " h0.out h1.out | grep -o "params=.*")
check "... $mine, bit for bit those of 2 + 2 ranks to step $at, then 2 + 1 from its checkpoint ($theirs)" \
  eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]' || tail -4 h0.out h1.out | sed 's/^/  | /'

# recover_check: host 1's idist-run killed at step 8 (its ranks 2 and 3 with it).
rm -rf ck refck
job
on 0 2 "$CHECK" ck 32 --recover --pause-ms 25 --progress
on 1 2 "$CHECK" ck 32 --recover --pause-ms 25 --progress
wait_for_line h0.out "^step 8$"
kill -9 "$(idist_run_of 1)"
wait
check "MLP with dropout, host 1 killed whole: host 0 ends with exit 0" \
  grep -q "succeeded after 1 re-form (node 1 (bravo) was lost: its idist-run ended or was killed; world 4 -> 2)" h0.out ||
  tail -5 h0.out
check "... every step done, one redone, every sample once" grep -q "^recover_check: done steps=32 redone=1 resumed_from=0 seen=2048 " h0.out ||
  grep done h0.out
at=$(grep "^recovered: generation 1 " h0.out | grep -o "after_step [0-9]*" | awk '{print $2}')
mine=$(grep -o "params=.*" h0.out)
IDIST_INTERHOST=gloo both 2 2 "$CHECK" refck "$at"
"$RUN" -n 2 "$CHECK" refck 32 >ref.out 2>&1
theirs=$(grep "^recover_check: done" ref.out | grep -o "params=.*")
check "... $mine, bit for bit those of 2 + 2 ranks to step $at, then 2 on host 0's layout" \
  eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]' || tail -3 ref.out
# A replacement over two hosts (--max-restarts 2: the job's budget, which the rendezvous
# spends): rank 3 (host 1) killed at step 8; host 1's idist-run starts rank 4 in its place,
# which is killed too while it starts (before it joined), then rank 5 in its place, which the
# survivors admit at a step boundary (world 4 -> 3 -> 4). The new world learns at its join that
# rank 5 runs on host 1, so it is laid out as 2 + 2 again: bit for bit the checkpoint restarts.
rm -rf ck refck
job
on 0 2 --max-restarts 2 "$CHECK" ck 48 --recover --pause-ms 60 --progress
on 1 2 --max-restarts 2 "$CHECK" ck 48 --recover --pause-ms 60 --progress
wait_for_line h0.out "^step 8$"
survivors=$(for r in 0 1 2; do rank_pid "$CHECK" $r; done | sort | tr '\n' ' ')
kill -9 "$(rank_pid "$CHECK" 3)"
wait_for_line h1.out "starts in rank 3's place"
kill -9 "$(grep -o "rank 4 (pid [0-9]*) starts" h1.out | grep -o "[0-9]*)" | tr -d ')')"
wait_for_line h0.out "^recovered: generation 2 "
still=$(for p in $survivors; do [ -d /proc/$p ] && echo "$p"; done | tr '\n' ' ')
wait
cat h0.out h1.out >out
check "MLP, a replacement on host 1 for its lost rank 3: both hosts end with exit 0" \
  eval 'grep -q "succeeded after 2 re-forms" h0.out && grep -q "succeeded after 2 re-forms" h1.out' || tail -n 5 h0.out h1.out
check "... rank 4 started in rank 3's place on host 1, rank 5 in rank 4's once that was killed before it joined" \
  eval 'grep -q "rank 4 (pid [0-9]*) starts in rank 3.s place" h1.out && grep -q "rank 4 was killed by SIGKILL (pid [0-9]*) before it joined" h1.out && grep -q "rank 5 (pid [0-9]*) starts in rank 4.s place" h1.out' ||
  grep -i "place\|joined" out
check "... the survivors admitted it: world 4 -> 3 -> 4" grep -q "^recovered: generation 2 world 4 after_step" h0.out ||
  grep "^recovered" out
check "... the survivors kept their processes ($still)" eval '[ -n "$survivors" ] && [ "$still" = "$survivors" ]'
check "... every step done, one redone, every sample once" \
  grep -q "^recover_check: done steps=48 redone=1 resumed_from=0 seen=3072 " out || grep done out
first=$(grep "^recovered: generation 1 " h0.out | grep -o "after_step [0-9]*" | awk '{print $2}')
second=$(grep "^recovered: generation 2 " h0.out | grep -o "after_step [0-9]*" | awk '{print $2}')
mine=$(grep -o "params=.*" out)
IDIST_INTERHOST=gloo both 2 2 "$CHECK" refck "$first"
IDIST_INTERHOST=gloo both 2 1 "$CHECK" refck "$second"
IDIST_INTERHOST=gloo both 2 2 "$CHECK" refck 48
theirs=$(grep -h "^recover_check: done" h0.out h1.out | grep -o "params=.*" | head -1)
check "... $mine, bit for bit those of 2 + 2 ranks to step $first, 2 + 1 to step $second, then 2 + 2" \
  eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]' || tail -n 3 h0.out h1.out

one_rank_node_replacement job on ""
finish
