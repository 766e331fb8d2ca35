#!/bin/bash
# The supervisor's two invariants with real idist-run "nodes" on loopback, in the phases that
# only a job over several nodes has (tests/unit/test_supervise.cpp covers every phase with one
# node and a coordinator that never answers): SIGTERM ends idist-run within --grace + 1 s, and
# --timeout ends it with 124 on time, while it waits for the other node to join, while it waits
# for the job's verdict, and as a restart verdict comes.
# usage: phases.sh IDIST_RUN
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
RANKS=$(cd "$(dirname "$0")" && pwd)/ranks
DIR=$(mktemp -d /tmp/idist-phases.XXXXXX)
trap 'pkill -9 -f "rdzv-id phases-$$" 2>/dev/null; pkill -CONT -f "rdzv-id phases-$$" 2>/dev/null; rm -rf "$DIR"' EXIT
export IDIST_JOB_TOKEN=$RANDOM$RANDOM

# node NAME [options...] -- PROGRAM...: node NAME of a 2-node job in the background; its pid in $NODE_PID.
node() {
  local name=$1
  shift
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  "$RUN" --nnodes 2 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "phases-$$" -n 1 --grace 1 "${opts[@]}" "$@" \
    >"$DIR/$name.out" 2>&1 &
  NODE_PID=$!
}
# ends_within PID SECONDS: waits for PID; its exit code in $ENDED_RC, the time taken in $TOOK_MS; false when still running.
ends_within() {
  local pid=$1 end=$(($(now_ms) + $2 * 1000)) start=$(now_ms)
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(now_ms)" -gt $end ]; then kill -9 "$pid"; wait "$pid"; TOOK_MS=never; ENDED_RC=none; return 1; fi
    sleep 0.02
  done
  wait "$pid"
  ENDED_RC=$?
  TOOK_MS=$(($(now_ms) - start))
}
wait_line() {
  local end=$(($(now_ms) + 20000))
  until grep -qF -- "$2" "$DIR/$1.out" 2>/dev/null; do
    [ "$(now_ms)" -lt $end ] || return 1
    sleep 0.05
  done
}

# --- starting: node 0 waits for a node that never comes -------------------------------------------
port=$(random_port)
node a -- /bin/true
wait_listening "$port"
sleep 0.3
kill -TERM $NODE_PID
ends_within $NODE_PID 2
check "waiting to join, SIGTERM: exit $ENDED_RC in $TOOK_MS ms (143, within --grace 1 + 1 s)" \
  eval '[ "$ENDED_RC" = 143 ] && [ "$TOOK_MS" -lt 2000 ]' || sed 's/^/  | /' "$DIR/a.out"

port=$(random_port)
start=$(now_ms)
node a --timeout 2 -- /bin/true
ends_within $NODE_PID 5
took=$(($(now_ms) - start))
check "waiting to join, --timeout 2: exit $ENDED_RC after $took ms (124, on time)" \
  eval '[ "$ENDED_RC" = 124 ] && [ "$took" -ge 1900 ] && [ "$took" -lt 3000 ]' || sed 's/^/  | /' "$DIR/a.out"

# --- awaiting the verdict: node 0's rank is done, node 1's still runs ------------------------------
port=$(random_port)
node a -- /bin/true
a=$NODE_PID
wait_listening "$port"
node b -- /bin/sleep "1000$MARKER"
b=$NODE_PID
sleep 1.5  # both joined, node 0's rank ended: it waits for node 1's
kill -TERM $a
ends_within $a 2
check "awaiting the verdict, SIGTERM: exit $ENDED_RC in $TOOK_MS ms (143, within 2 s)" \
  eval '[ "$ENDED_RC" = 143 ] && [ "$TOOK_MS" -lt 2000 ]' || sed 's/^/  | /' "$DIR/a.out"
ends_within $b 10
check "... node 1 ends too, naming node 0's leaving (exit $ENDED_RC)" \
  eval '[ "$ENDED_RC" != 0 ] && grep -q "node 0.*left the job: interrupted by SIGTERM" "$DIR/b.out"' || sed 's/^/  | /' "$DIR/b.out"

port=$(random_port)
node a --timeout 3 -- /bin/true
a=$NODE_PID
wait_listening "$port"
start=$(now_ms)
node b --timeout 3 -- /bin/sleep "1000$MARKER"
b=$NODE_PID
ends_within $a 6
took=$(($(now_ms) - start))
check "awaiting the verdict, --timeout 3: exit $ENDED_RC after $took ms (124, on time)" \
  eval '[ "$ENDED_RC" = 124 ] && [ "$took" -lt 4000 ]' || sed 's/^/  | /' "$DIR/a.out"
ends_within $b 6

# --- a restart: SIGTERM as the restart verdict comes (node 0 then joins attempt 1, or starts it) ------
port=$(random_port)
restarting='if [ "$IDIST_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then sleep 0.3; exit 9; fi; exec sleep "1000$MARKER"'
node a --max-restarts 1 -- bash -c "$restarting"
a=$NODE_PID
wait_listening "$port"
node b --max-restarts 1 -- bash -c "$restarting"
b=$NODE_PID
if wait_line a "restarting every node"; then
  kill -TERM $a
  ends_within $a 2
  check "at a restart, SIGTERM: exit $ENDED_RC in $TOOK_MS ms (143, within 2 s)" \
    eval '[ "$ENDED_RC" = 143 ] && [ "$TOOK_MS" -lt 2000 ]' || sed 's/^/  | /' "$DIR/a.out"
else
  check "the restart verdict came" false
  sed 's/^/  | /' "$DIR/a.out"
fi
ends_within $b 15

check "nothing left behind" no_leftovers
finish
