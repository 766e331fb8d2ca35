#!/bin/bash
# A healthy job must never be reported as stalled: 3 ranks for 80 s under --stall-timeout 5,
# phases of 4-7 s of work (sleeping or spinning, unequal between ranks, so that some wait up to
# 3 s in the collective after it), then all_reduce, broadcast, a ring of send/recv and a barrier.
# Also asks --status in the middle. Runs beside the other tests (it mostly sleeps). 80 s, not the
# 3 minutes it once ran: a dozen rounds, each with waits of up to 3 s, say as much, and a slot of
# the suite's two is not held by a sleeper for 3 minutes.
# usage: stall_healthy.sh IDIST_RUN STALL_RANK
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
STALL=$(realpath "$2")
DIR=$(mktemp -d /tmp/idist-stall-healthy.XXXXXX)
trap 'rm -rf "$DIR"' EXIT

start=$(now_ms)
"$RUN" -n 3 --stall-timeout 5 "$STALL" healthy 80 >"$DIR/out" 2>&1 &
job=$!
sleep 40
"$RUN" --status "$job" >"$DIR/status" 2>&1
status_rc=$?
wait $job
rc=$?
took=$((($(now_ms) - start) / 1000))
rounds=$(grep -c "^rank 0 round" "$DIR/out")
echo "  $took s, $rounds rounds per rank; --status at 40 s:"
sed 's/^/  | /' "$DIR/status"
check "a healthy 80 s job under --stall-timeout 5: exit 0 ($rc) after $took s" eval '[ $rc = 0 ] && [ $took -ge 80 ]'
check "... no stall or mismatch reported" eval '! grep -qE "stall:|mismatch:" "$DIR/out"'
check "... every rank went through the same rounds ($rounds)" eval \
  '[ $rounds -ge 9 ] && [ "$(grep -c "^rank 1 round" "$DIR/out")" = $rounds ] && [ "$(grep -c "^rank 2 round" "$DIR/out")" = $rounds ]'
check "... --status answered in the middle, a line per rank" eval \
  '[ $status_rc = 0 ] && [ $(grep -cE "^ +[0-2] +[0-9]+  " "$DIR/status") = 3 ]'
finish
