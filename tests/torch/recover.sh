#!/bin/bash
# idist::Recovery (issue 46, live recovery) on train_cifar10 --recover, a small ResNet-18 on
# synthetic CIFAR: a rank killed with kill -9 mid-epoch (rank 1, and rank 0, which hosted the
# first store) costs one step. The survivors keep their processes (one attempt), the job ends 0
# with every step done, one redone, every sample used as often as without the kill, and the
# parameters bit for bit those of a run stopped at the step the re-form went on from and resumed
# from its checkpoint on the smaller world: the same global batches, the same model.
# The same on an MLP with dropout (recover_check.cpp): a survivor one step behind takes the
# step from one ahead; two losses one after the other; the time from a kill to the survivors'
# next committed step.
# usage: recover.sh IDIST_RUN EXAMPLES_DIR RECOVER_CHECK
source "$(dirname "$0")/../e2e/lib.sh"
recover_programs "$@"
export OMP_NUM_THREADS=1
small=(--width 8 --samples 1024 --batch-size 32 --epochs 2 --learning-rate 0.01 --log-every 4)

# pid_of_rank RUN_PID RANK: the child of idist-run that is RANK (asked again for up to 2 s: a
# look under CI's load once found none).
pid_of_rank() {
  local p i
  for i in $(seq 20); do
    for p in $(pgrep -P "$1"); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
    done
    sleep 0.1
  done
  echo "# pid_of_rank: no child of $1 is RANK=$2" >&2
}

# killed_mid_run LABEL N VICTIM [ENV...]: N ranks, VICTIM killed in epoch 1's 12th iteration.
killed_mid_run() {
  local label=$1 n=$2 victim=$3
  shift 3
  rm -rf ck ref
  # Emptied here: the job's shell truncates it only once it runs, and the wait below could
  # read the last case's lines first (it once killed a rank still starting, under CI's load).
  : >out
  env "$@" "$RUN" -n "$n" --log-dir logs.$victim "$PROG" --recover "${small[@]}" --output-path ck >out 2>&1 &
  local job=$! i rc
  wait_for_line out "Iteration\[12/"
  kill -9 "$(pid_of_rank $job "$victim")"
  wait $job
  rc=$?
  check "$label: the job ends with exit 0 (got $rc)" test $rc = 0 || tail -5 out
  check "... idist-run says so, the survivors in one attempt" \
    grep -q "succeeded after 1 re-form (rank $victim was killed by SIGKILL; world $n -> $((n - 1)))" out
  check "... a world of $((n - 1)) goes on" grep -q "^Re-formed: generation 1, world of $((n - 1)), after step" out
  check "... every step done, one redone, every sample once" grep -q "^train_cifar10: done steps=64 redone=1 resumed_from=0 seen=2048 " out ||
    grep "done" out
  local at mine theirs
  at=$(grep -o "after step [0-9]*" out | awk '{print $3}')
  mine=$(grep -o "params=.*" out)
  env "$@" "$RUN" -n "$n" "$PROG" "${small[@]}" --steps "$at" --output-path ref >ref.out 2>&1
  env "$@" "$RUN" -n $((n - 1)) "$PROG" "${small[@]}" --output-path ref >>ref.out 2>&1
  theirs=$(grep "resumed_from=$at " ref.out | grep -o "params=.*")
  check "... $mine, bit for bit those of $n ranks to step $at, then $((n - 1)) from its checkpoint ($theirs)" \
    eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]' || tail -3 ref.out
}

killed_mid_run "kill -9 of rank 1 of 4, over shared memory" 4 1
killed_mid_run "kill -9 of rank 0 of 4, which hosted the first store" 4 0
killed_mid_run "kill -9 of rank 2 of 3, over TCP" 3 2 IDIST_INTRANODE=off

# reference OUT N1:K1 N2:K2 ...: N1 ranks to step K1, then N2 ranks from its checkpoint to K2, ...
reference() {
  local out=$1 part
  shift
  rm -rf refck
  for part in "$@"; do
    read -r -a words <<<"${part##*:}"
    "$RUN" -n "${part%%:*}" "$CHECK" refck "${words[@]}" >>"$out" 2>&1
  done
  grep "^recover_check: done" "$out" | tail -1 | grep -o "params=.*"
}
after_step() { grep "^recovered: generation $2 " "$1" | grep -o "after_step [0-9]*" | awk '{print $2}'; }

# staged_behind LABEL R K: 4 ranks; rank R lets the others commit step K, kills rank 3, and raises
# before its own optimizer step (--stage-behind): it must take step K from one that has it.
staged_behind() {
  local label=$1 r=$2 k=$3 rc mine theirs
  rm -rf ck
  "$RUN" -n 4 "$CHECK" ck 32 --recover --stage-behind "$r:3:$k" >out 2>&1
  rc=$?
  check "$label: exit 0 (got $rc)" test $rc = 0 || tail -5 out
  check "... it took step $k from a rank that had it (caught_up_bytes > 0)" \
    grep -qE "^recovered: generation 1 world 3 after_step $k .* caught_up_bytes=[1-9]" out || grep recovered out
  check "... every step done, one redone, every sample once" \
    grep -q "^recover_check: done steps=32 redone=1 resumed_from=0 seen=2048 " out || grep done out
  mine=$(grep -o "params=.*" out)
  theirs=$(reference "ref.$r.$k.out" "4:$k" 3:32)
  check "... $mine, bit for bit those of 4 ranks to step $k, then 3 from its checkpoint" \
    eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]'
}
# In place (SGD's momenta on every rank); and at the first step, where the rank behind has no
# momenta yet, so that the step travels in torch's archive.
staged_behind "MLP with dropout, rank 0 one step behind" 0 6
staged_behind "MLP, rank 2 behind at the first step" 2 1

# Two losses one after the other: rank 1 at step 8, then rank 2 (of the first world) at step 20,
# in a step that zeroes its gradients at its end (the interrupted backward's must not remain).
rm -rf ck
: >out
"$RUN" -n 4 "$CHECK" ck 32 --recover --pause-ms 25 --progress --zero-at-end >out 2>&1 &
job=$!
wait_for_line out "^step 8$"
killed_ns=$(date +%s%N)
kill -9 "$(pid_of_rank $job 1)"
wait_for_line out "^step 20$"
kill -9 "$(pid_of_rank $job 2)"
wait $job
rc=$?
check "MLP with dropout, two kills: exit 0 (got $rc)" test $rc = 0 || tail -5 out
check "... idist-run says so" grep -q "succeeded after 2 re-forms" out || grep idist-run out
check "... every step done, two redone, every sample once" grep -q "^recover_check: done steps=32 redone=2 resumed_from=0 seen=2048 " out ||
  grep done out
first=$(after_step out 1)
second=$(after_step out 2)
mine=$(grep -o "params=.*" out)
theirs=$(reference ref2.out "4:$first --zero-at-end" "3:$second --zero-at-end" "2:32 --zero-at-end")
check "... $mine, bit for bit those of 4 ranks to step $first, 3 to step $second, then 2" \
  eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]'
committed=$(grep "^recovered: generation 1 " out | grep -o "committed_ns=[0-9]*" | cut -d= -f2)
ms=$(( (${committed:-0} - killed_ns) / 1000000 ))
echo "# from the first kill to the survivors' next committed step: $ms ms (a step pauses 25 ms)"
check "... the survivors' next step committed within 2 s of the kill ($ms ms)" test "$ms" -ge 0 -a "$ms" -lt 2000
# A replacement (--max-restarts 2): rank 1 killed at step 8; idist-run starts a rank in its
# place, which is killed too while it starts (before it joined), and another starts in its
# place, which the 3 survivors admit at a step boundary they agree on (world 4 -> 3 -> 4); it
# takes the job's state from one of them, and no checkpoint is read. Steps of 60 ms or more:
# the replacement's start (a libtorch program's) and its setup (1.2 s of sleep here, as a slow
# data load) must fit in what is left of the run; the survivors train on meanwhile.
rm -rf ck
: >out
"$RUN" -n 4 --max-restarts 2 "$CHECK" ck 80 --recover --pause-ms 60 --progress --replacement-setup-ms 1200 >out 2>&1 &
job=$!
wait_for_line out "^step 8$"
survivors=$(for r in 0 2 3; do pid_of_rank $job $r; done | sort | tr '\n' ' ')
kill -9 "$(pid_of_rank $job 1)"
wait_for_line out "starts in rank 1's place"
kill -9 "$(grep -o "rank 4 (pid [0-9]*) starts" out | grep -o "[0-9]*)" | tr -d ')')"
wait_for_line out "^recovered: generation 2 "
still=$(for p in $survivors; do [ -d /proc/$p ] && echo "$p"; done | tr '\n' ' ')
wait $job
rc=$?
check "MLP, a replacement for a lost rank: exit 0 (got $rc)" test $rc = 0 || tail -5 out
check "... idist-run started rank 4 in rank 1's place, and rank 5 in rank 4's once that was killed before it joined" \
  eval 'grep -q "rank 4 (pid [0-9]*) starts in rank 1.s place" out && grep -q "rank 4 was killed by SIGKILL (pid [0-9]*) before it joined" out && grep -q "rank 5 (pid [0-9]*) starts in rank 4.s place" out' ||
  grep -i "place\|restart\|joined" out
check "... the survivors admitted it: world 4 -> 3 -> 4" grep -q "^recovered: generation 2 world 4 after_step" out ||
  grep "^recovered" out
check "... the survivors kept their processes ($still)" eval '[ -n "$survivors" ] && [ "$still" = "$survivors" ]'
check "... idist-run says so" grep -q "succeeded after 2 re-forms" out || grep idist-run out
check "... every step done, one redone, every sample once" \
  grep -q "^recover_check: done steps=80 redone=1 resumed_from=0 seen=5120 " out ||
  grep done out
admitted=$(grep "^recovered: generation 2 " out | grep -o "reconcile_ms=[0-9]*" | cut -d= -f2)
check "... admitted once set up: the survivors waited ${admitted:-?} ms in its reconcile, not its 1.2 s setup" \
  eval '[ -n "$admitted" ] && [ "$admitted" -lt 800 ]'
first=$(after_step out 1)
second=$(after_step out 2)
mine=$(grep -o "params=.*" out)
theirs=$(reference ref4.out "4:$first" "3:$second" "4:80")
check "... $mine, bit for bit those of 4 ranks to step $first, 3 to step $second, then 4" \
  eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]'
# A replacement frozen (SIGSTOP) while it starts, before it asks to join: it has no heartbeat
# yet, so nobody waits for it; the 3 survivors train on to the end, and idist-run stops it then
# (not the job's failure).
rm -rf ck
: >out
"$RUN" -n 4 --max-restarts 1 "$CHECK" ck 32 --recover --pause-ms 60 --progress --replacement-setup-ms 1200 >out 2>&1 &
job=$!
wait_for_line out "^step 8$"
kill -9 "$(pid_of_rank $job 1)"
wait_for_line out "starts in rank 1's place"
frozen=$(grep -o "rank 4 (pid [0-9]*) starts" out | grep -o "[0-9]*)" | tr -d ')')
kill -STOP "$frozen"
wait $job
rc=$?
check "MLP, a replacement frozen while it starts: exit 0 (got $rc)" test $rc = 0 || tail -5 out
check "... the survivors went on as a world of 3, and idist-run stopped the frozen one at the end" \
  eval 'grep -q "succeeded after 1 re-form (rank 1 was killed by SIGKILL; world 4 -> 3)" out && ! kill -0 "$frozen" 2>/dev/null' ||
  tail -3 out
check "... every step done, one redone, every sample once" \
  grep -q "^recover_check: done steps=32 redone=1 resumed_from=0 seen=2048 " out || grep done out
at=$(after_step out 1)
mine=$(grep -o "params=.*" out)
theirs=$(reference ref5.out "4:$at" 3:32)
check "... $mine, bit for bit those of 4 ranks to step $at, then 3" eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]'
# A loss between steps: each step is followed by a retry() block (a pause, an all_reduce of the
# loss); rank 3 is killed in it, after step 8, and the block runs again in the world of 3.
rm -rf ck
: >out
"$RUN" -n 4 "$CHECK" ck 24 --recover --between-ms 40 --progress >out 2>&1 &
job=$!
wait_for_line out "^step 8$"
kill -9 "$(pid_of_rank $job 3)"
wait $job
rc=$?
check "MLP, a loss between steps (in retry): exit 0 (got $rc)" test $rc = 0 || tail -5 out
check "... every step done, every sample once" grep -qE "^recover_check: done steps=24 redone=[01] resumed_from=0 seen=1536 " out ||
  grep done out
at=$(after_step out 1)
mine=$(grep -o "params=.*" out)
theirs=$(reference ref3.out "4:$at" 3:24)
check "... $mine, bit for bit those of 4 ranks to step $at, then 3" eval '[ -n "$mine" ] && [ "$mine" = "$theirs" ]'
finish
