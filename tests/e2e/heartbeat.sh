#!/bin/bash
# Frozen ranks (issue 46, live recovery's heartbeat): a rank that opted in
# (InitOptions::recovery) beats a heartbeat in its recorder's memory; frozen with SIGSTOP, it is
# named and stopped within --heartbeat-timeout, and the job fails at once instead of its peers
# waiting for IDIST_TIMEOUT. A rank that beats on through a long computation is not frozen, and
# a rank that did not opt in is never stopped for a missing heartbeat.
# usage: heartbeat.sh IDIST_RUN STALL_RANK
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
private_copy stall_rank "$2"
STALL=$PROG

# start_job OUT ARGS...: idist-run in the background; waits for rank 1's pid line.
start_job() {
  local out=$1
  shift
  : >"$out"
  "$RUN" "$@" >"$out" 2>&1 &
  job=$!
  for i in $(seq 400); do grep -q "rank 1 pid" "$out" && break; sleep 0.05; done
  pid=$(awk '$1 == "rank" && $2 == 1 && $3 == "pid" {print $4}' "$out")
}

# Opted in, rank 1 frozen: named and stopped 1 s after (with the 0.1 s check), the job over.
STALL_RANK_RECOVERY=1 start_job "$DIR/out" -n 3 --heartbeat-timeout 1 --timeout 60 --log-dir "$DIR/logs" \
  "$STALL" loop 3000 20
sleep 0.5
kill -STOP "$pid"
start=$(now_ms)
wait $job
rc=$?
took=$(($(now_ms) - start))
check "an opted-in rank frozen by SIGSTOP ends the job $took ms later (timeout 1 s; bound 4000)" test "$took" -lt 4000 ||
  cat "$DIR/out"
check "... named as frozen, with its pid and how long it was silent" \
  grep -qE "rank 1 \(pid $pid\) is frozen: no heartbeat for [0-9]+(\.[0-9])?s \(--heartbeat-timeout 1s\): stopping it \(SIGKILL\)" \
  "$DIR/out"
check "... the job's outcome says why rank 1 was killed" \
  grep -qE "rank 1 \(pid $pid on [^)]*\) was killed by SIGKILL \(idist-run stopped it: frozen, no heartbeat for [0-9]+(\.[0-9])?s\)" \
  "$DIR/out"
check "... with a non-zero exit ($rc)" test "$rc" -ne 0
check "... and summary.json has the silence" eval \
  'python3 -c "import json,glob,sys; s=json.load(open(glob.glob(\"$DIR/logs/*/summary.json\")[0])); r=[x for a in s[\"attempts\"] for x in a[\"ranks\"] if x[\"rank\"]==1][0]; sys.exit(0 if r[\"frozen_s\"] and r[\"frozen_s\"] >= 1 else 1)"'

# Opted in, rank 1 busy in its own code for 3 s between collectives: it beats on.
: >"$DIR/out"
STALL_RANK_RECOVERY=1 "$RUN" -n 3 --heartbeat-timeout 1 --timeout 60 "$STALL" sleep 1 3 >"$DIR/out" 2>&1
rc=$?
check "an opted-in rank 3 s in its own code is not frozen (exit $rc)" eval \
  '[ $rc = 0 ] && ! grep -q "frozen" "$DIR/out"' || cat "$DIR/out"

# Not opted in: a rank stopped for 2 s under --heartbeat-timeout 1 is not stopped by idist-run.
start_job "$DIR/out" -n 3 --heartbeat-timeout 1 --stall-timeout 0 --timeout 60 "$STALL" loop 150 20
sleep 0.5
kill -STOP "$pid"
sleep 2
kill -CONT "$pid"
wait $job
rc=$?
check "a rank that beats no heartbeat, stopped for 2 s, is left alone (exit $rc)" eval \
  '[ $rc = 0 ] && ! grep -q "frozen" "$DIR/out"' || cat "$DIR/out"

finish
