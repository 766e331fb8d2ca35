#!/bin/bash
# idist::Recovery (issue 46, live recovery) on train_cifar10 --recover, a small ResNet-18 on
# synthetic CIFAR: a rank killed with kill -9 mid-epoch (rank 1, and rank 0, which hosted the
# first store) costs one step. The survivors keep their processes (one attempt), the job ends 0
# with every step done, one redone, every sample used as often as without the kill, and the
# parameters bit for bit those of a run stopped at the step the re-form went on from and resumed
# from its checkpoint on the smaller world: the same global batches, the same model.
# usage: recover.sh IDIST_RUN EXAMPLES_DIR
source "$(dirname "$0")/../e2e/lib.sh"
RUN=$(realpath "$1")
private_copy train_cifar10 "$2/train_cifar10"
cd "$DIR"
export OMP_NUM_THREADS=1
small=(--width 8 --samples 1024 --batch-size 32 --epochs 2 --learning-rate 0.01 --log-every 4)

# pid_of_rank RUN_PID RANK: the child of idist-run that is RANK.
pid_of_rank() {
  local p
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "RANK=$2" && { echo "$p"; return; }
  done
}

# killed_mid_run LABEL N VICTIM [ENV...]: N ranks, VICTIM killed in epoch 1's 12th iteration.
killed_mid_run() {
  local label=$1 n=$2 victim=$3
  shift 3
  rm -rf ck ref
  env "$@" "$RUN" -n "$n" --log-dir logs.$victim "$PROG" --recover "${small[@]}" --output-path ck >out 2>&1 &
  local job=$! i rc
  for i in $(seq 600); do grep -q "Iteration\[12/" out && break; sleep 0.02; done
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
finish
