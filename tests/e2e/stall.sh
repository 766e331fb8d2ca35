#!/bin/bash
# Who is stuck where (issue 18, first part): idist-run reads each rank's flight recorder and,
# when a rank has waited --stall-timeout in one collective, names the collective, who waits and
# who never came (with its process state); collectives called differently by different ranks
# are named as they happen, and a job whose ranks all exit 0 after such a call does not exit 0.
# usage: stall.sh IDIST_RUN EXAMPLES_DIR JOB_SUM STALL_RANK
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
STALL=$(realpath "$4")
DIR=$(mktemp -d /tmp/idist-stall.XXXXXX)
trap 'pkill -CONT -f "^$STALL " 2>/dev/null; pkill -9 -f "^$STALL " 2>/dev/null; rm -rf "$DIR"' EXIT

# A rank frozen by SIGSTOP (rank 0, which hosts the store, and rank 2): named within the stall
# timeout plus a second, as stopped; the others as waiting. SIGCONT, and the job ends well.
for victim in 0 2; do
  "$RUN" -n 3 --stall-timeout 2 --timeout 60 "$STALL" loop 300 20 >"$DIR/out" 2>&1 &
  job=$!
  for i in $(seq 100); do grep -q "rank $victim pid" "$DIR/out" && break; sleep 0.05; done
  pid=$(awk -v r="$victim" '$1 == "rank" && $2 == r && $3 == "pid" {print $4}' "$DIR/out")
  sleep 0.5
  kill -STOP "$pid"
  start=$(now_ms)
  while ! grep -q "stall:" "$DIR/out" && [ $(($(now_ms) - start)) -lt 10000 ]; do sleep 0.05; done
  took=$(($(now_ms) - start))
  kill -CONT "$pid"
  wait $job
  rc=$?
  others=$( [ $victim = 0 ] && echo "ranks 1, 2" || echo "ranks 0, 1")
  check "SIGSTOP of rank $victim: reported after $took ms (stall timeout 2 s; bound 7000)" test "$took" -lt 7000
  check "... naming the collective, $others waiting and rank $victim stopped" eval \
    'grep -qE "stall: all_reduce #[0-9]+ on group world \(float32, 2 elements\): $others waiting [0-9.]+ s; rank $victim never entered it \(last completed: all_reduce #[0-9]+; state: stopped \(SIGSTOP or SIGTSTP\)\)" "$DIR/out"'
  check "... and after SIGCONT the job ends well (exit 0)" equals "$rc" 0
done

# A rank in its own code (sleep) before a collective: named as sleeping, the job then ends well.
"$RUN" -n 3 --stall-timeout 1 --timeout 60 "$STALL" sleep 1 4 >"$DIR/out" 2>&1
rc=$?
check "a rank sleeping in its own code: named, with where it sleeps" eval \
  'grep -qE "stall: all_reduce #3 on group world .*: ranks 0, 2 waiting .* rank 1 never entered it \(last completed: all_reduce #2; state: sleeping in [a-z_]+" "$DIR/out"'
check "... and the job ends well (exit 0)" equals "$rc" 0

# A rank that skips a barrier: its next all_reduce meets the others' barrier. Said at once, and
# the wait that follows is named too.
"$RUN" -n 3 --stall-timeout 1 --timeout 5 "$STALL" skip_barrier 2 >"$DIR/out" 2>&1
rc=$?
check "a rank that skips a barrier: the mismatch named (ranks 0, 1 barrier, rank 2 all_reduce)" contains "$(cat "$DIR/out")" \
  "mismatch: collective #4 on group world: ranks 0, 1 called barrier, rank 2 called all_reduce (float32, 2 elements)"
check "... and the stall after it" eval 'grep -q "stall: all_reduce #6 on group world" "$DIR/out"'
check "... the job does not exit 0 (exit $rc)" test "$rc" -ne 0

# A rank that calls all_reduce with another count: the job is short (no periodic check sees it),
# every rank exits 0, and the results are wrong. idist-run says so and exits 1.
"$RUN" -n 3 --stall-timeout 60 "$STALL" count 0 >"$DIR/out" 2>&1
rc=$?
check "another count on rank 0: the mismatch named" contains "$(cat "$DIR/out")" \
  "mismatch: collective #3 on group world: rank 0 called all_reduce (float32, 3 elements), ranks 1, 2 called all_reduce (float32, 2 elements)"
check "... and although every rank exited 0, exit 1" equals "$rc" 1
check "... saying why" contains "$(cat "$DIR/out")" "every rank exited 0, but their collectives did not match"

# A healthy job with compute phases longer than the stall timeout between collectives: no report.
"$RUN" -n 3 --stall-timeout 1 "$STALL" loop 6 1500 >"$DIR/out" 2>&1
rc=$?
check "a healthy job pausing 1.5 s between collectives under --stall-timeout 1: exit 0, no report" \
  eval '[ $rc = 0 ] && ! grep -qE "stall:|mismatch:" "$DIR/out"'

finish
