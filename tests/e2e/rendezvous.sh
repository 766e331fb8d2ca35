#!/bin/bash
# Jobs over several nodes that recover together (--rdzv-endpoint, one rendezvous for the job):
# "nodes" are idist-run processes on loopback, each with ranks of its own; job_sum's ranks
# check every sum. A rank that crashes while the other node computes, a node whose idist-run
# is killed (fixed size, and MIN:MAX), frozen, or lost between attempts, a node that never stops
# its ranks or cannot start them, a node that arrives late, one restart budget for the job, a
# port held by another program, a connection that never joins.
# usage: rendezvous.sh IDIST_RUN EXAMPLES_DIR JOB_SUM
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
JOB_SUM=$(realpath "$3")
DIR=$(mktemp -d /tmp/idist-rendezvous.XXXXXX)
trap 'pkill -9 -f "rdzv-id rdzv-test-$$" 2>/dev/null; rm -rf "$DIR"' EXIT
export IDIST_TIMEOUT=30

# node NAME NNODES [idist-run options...] -- [job_sum args]: one node in the background, its
# output in $DIR/NAME.out and its exit code in $DIR/NAME.rc; its pid in $NODE_PID.
node() {
  local name=$1 nnodes=$2
  shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  node_running "$name" "$nnodes" "${opts[@]}" -- "$JOB_SUM" "$@"
}
# node_running NAME NNODES [idist-run options...] -- PROGRAM [args]: the same with any program.
node_running() {
  local name=$1 nnodes=$2
  shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  rm -f "$DIR/$name.rc"
  (timeout 120 "$RUN" --nnodes "$nnodes" --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "rdzv-test-$$" -n 2 \
     "${opts[@]}" "$@" >"$DIR/$name.out" 2>&1
   echo $? >"$DIR/$name.rc") &
  NODE_PID=$!
}
# The idist-run (not the subshell) of a node started by node().
agent_of() { pgrep -P "$(pgrep -P "$1" timeout)" idist-run; }
rc() { cat "$DIR/$1.rc"; }
out() { cat "$DIR/$1.out"; }
new_port() { port=$(random_port); }
count_re() { grep -cE -- "$2" <<<"$1" || true; }
# wait_line NAME TEXT [SECONDS=20]: until node NAME's output has TEXT; false after SECONDS.
wait_line() {
  local end=$(($(now_ms) + ${3:-20} * 1000))
  until grep -qF -- "$2" "$DIR/$1.out" 2>/dev/null; do
    [ "$(now_ms)" -lt $end ] || return 1
    sleep 0.05
  done
}

# --- a rank crashes while the other node computes: every node restarts, 10 runs of 10 -----------
recovered=0
for run in $(seq 0 9); do
  new_port
  crash=$((run % 4))  # ranks 0, 1 are node 0's (it hosts), 2, 3 node 1's
  export JOB_SUM_CRASH="$crash:5"
  node a 2 --max-restarts 2 -- 20 25 5
  wait_listening "$port"  # node a hosts: it binds the endpoint first
  node b 2 --max-restarts 2 -- 20 25 5
  wait
  unset JOB_SUM_CRASH
  both=$(out a; out b)
  if [ "$(rc a)/$(rc b)" = 0/0 ] && [ "$(count "$both" "attempt 1 sum 50 right")" = 4 ] &&
    [ "$(count "$both" "attempt 0 ended: rank $crash on node")" = 2 ]; then
    recovered=$((recovered + 1))
  else
    echo "# run $run (rank $crash crashes): exit $(rc a)/$(rc b)"
    sed 's/^/#   a| /' "$DIR/a.out"
    sed 's/^/#   b| /' "$DIR/b.out"
  fi
done
check "a rank crashing in attempt 0 while the other node computes: recovered in $recovered of 10 runs, every sum right" \
  equals $recovered 10

# --- the same with torch.distributed (env://, gloo: torch's own TCPStore and Gloo, nothing of
# idist's in the ranks): each attempt's ranks find a fresh MASTER_PORT, never the last one's store.
TORCH_SUM=$(cd "$(dirname "$0")" && pwd)/python/torch_job_sum.py
if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  recovered=0
  for run in 0 1 2; do
    new_port
    crash=$((run + 1))
    for n in a b; do
      (PATH=/usr/bin:$PATH JOB_SUM_CRASH="$crash:3" timeout 120 "$RUN" --nnodes 2 --rdzv-endpoint "127.0.0.1:$port" \
         --rdzv-id "rdzv-test-$$" -n 2 --max-restarts 1 "$TORCH_SUM" 10 5 >"$DIR/$n.out" 2>&1
       echo $? >"$DIR/$n.rc") &
      sleep 0.3
    done
    wait
    if [ "$(rc a)/$(rc b)" = 0/0 ] && [ "$(count "$(out a; out b)" "attempt 1 sum 50 right")" = 4 ]; then
      recovered=$((recovered + 1))
    else
      echo "# torch run $run: exit $(rc a)/$(rc b)"; sed 's/^/#   | /' "$DIR/a.out" "$DIR/b.out"
    fi
  done
  check "torch.distributed, a rank crashing in attempt 0: recovered in $recovered of 3 runs, every sum right" equals $recovered 3
else
  echo "skipped: torch.distributed with a crashing rank (/usr/bin/python3 cannot import torch)"
fi

# --- one restart budget for the job ----------------------------------------------------------------
# Rank 1 (node 0) fails in attempt 0, rank 3 (node 1) in attempt 1: with --max-restarts 1 the job
# ends after attempt 1 on both nodes, with rank 3's code, whichever node failed before.
new_port
export JOB_SUM_CRASH="1:5:0,3:5:1"
node a 2 --max-restarts 1 -- 20 25 5
wait_listening "$port"  # node a hosts: it binds the endpoint first
node b 2 --max-restarts 1 -- 20 25 5
wait
check "the budget is the job's: two failures on two nodes, --max-restarts 1: both nodes exit 7" equals "$(rc a)/$(rc b)" 7/7
for n in a b; do
  check "... node $n says attempt 0 ended by rank 1, then the job failed with rank 3" \
    eval 'contains "$(out $n)" "attempt 0 ended: rank 1 on node 0" && contains "$(out $n)" "the job failed: rank 3 on node 1"'
done
new_port
node a 2 --max-restarts 2 -- 20 25 5
wait_listening "$port"  # node a hosts: it binds the endpoint first
node b 2 --max-restarts 2 -- 20 25 5
wait
unset JOB_SUM_CRASH
check "... with --max-restarts 2 the job succeeds on attempt 2, every sum right" \
  eval '[ "$(rc a)/$(rc b)" = 0/0 ] && [ "$(count "$(out a; out b)" "attempt 2 sum 50 right")" = 4 ]'

# --- kill -9 of a node's idist-run: the other ends within 5 s plus its grace ------------------------
for victim in b a; do
  new_port
  node a 2 --max-restarts 3 --grace 1 -- 400 25 5
  pid_a=$NODE_PID
  wait_listening "$port"  # node a hosts: it binds the endpoint first
  node b 2 --max-restarts 3 --grace 1 -- 400 25 5
  pid_b=$NODE_PID
  sleep 1.5
  [ $victim = a ] && { kill -9 "$(agent_of $pid_a)"; survivor=$pid_b; s=b; } || { kill -9 "$(agent_of $pid_b)"; survivor=$pid_a; s=a; }
  start=$(now_ms)
  wait $survivor
  took=$(($(now_ms) - start))
  wait
  if [ $victim = b ]; then
    check "kill -9 of node 1's idist-run (2 nodes, restarts left): node 0 exits 1 in $took ms (bound 6000)" \
      eval '[ "$(rc a)" = 1 ] && [ $took -lt 6000 ]'
    check "... naming node 1 and why the job cannot go on" contains "$(out a)" \
      "node 1 ($(hostname)) was lost: its idist-run ended or was killed; 1 node left, the job needs 2"
  else
    check "kill -9 of node 0's idist-run (the rendezvous host): node 1 exits 1 in $took ms (bound 6000)" \
      eval '[ "$(rc b)" = 1 ] && [ $took -lt 6000 ]'
    check "... naming the rendezvous it lost" contains "$(out b)" "lost the rendezvous at 127.0.0.1:$port (node 0)"
  fi
done
sleep 0.5
check "no rank outlives its idist-run" equals "$(pgrep -c -f "$JOB_SUM 400 25 5")" 0

# --- MIN:MAX: a lost node is left out, the others go on ----------------------------------------------
new_port
node a 2:3 --max-restarts 2 --rdzv-conf last_call_timeout=0.5 -- 80 25 5
wait_listening "$port"  # node a hosts: it binds the endpoint first
node b 2:3 --max-restarts 2 --rdzv-conf last_call_timeout=0.5 -- 80 25 5
node c 2:3 --max-restarts 2 --rdzv-conf last_call_timeout=0.5 -- 80 25 5
pid_c=$NODE_PID
sleep 1.5
kill -9 "$(agent_of $pid_c)"
wait
check "--nnodes 2:3, kill -9 of one node's idist-run: the other two exit 0" equals "$(rc a)/$(rc b)" 0/0
check "... re-formed without it: 4 ranks of attempt 1 sum 50" equals "$(count_re "$(out a; out b)" "rank [0-3]/4 port [0-9]+ attempt 1 sum 50 right")" 4

# --- MIN:MAX: a node that arrives late joins the next attempt --------------------------------------
# The re-form stops node a's ranks, and node b's may fail on their lost peers before b's idist-run
# reads the end: that must not count as a failure (--max-restarts 0 would end the job). 5 runs.
# Meanwhile a lone node waits for a partner, and a connection to it that never joins is closed
# after 10 s (a stranger must not hold a socket of the rendezvous for ever).
new_port
lone_port=$port
node_running lone 2 -- /bin/true
lone=$NODE_PID
sleep 0.5
(exec 3<>"/dev/tcp/127.0.0.1/$lone_port" || exit
 start=$(now_ms)
 timeout 20 cat <&3 >/dev/null
 echo $(($(now_ms) - start)) >"$DIR/handshake.took") &
handshake=$!
reformed=0
for run in 1 2 3 4 5; do
  new_port
  node a 2:3 --max-restarts 0 --rdzv-conf last_call_timeout=0.3 -- 40 25 5
  pid_a=$NODE_PID
  wait_listening "$port"  # node a hosts: it binds the endpoint first
  node b 2:3 --max-restarts 0 --rdzv-conf last_call_timeout=0.3 -- 40 25 5
  pid_b=$NODE_PID
  sleep 0.7
  node c 2:3 --max-restarts 0 --rdzv-conf last_call_timeout=0.3 -- 40 25 5
  wait $pid_a $pid_b $NODE_PID
  if [ "$(rc a)/$(rc b)/$(rc c)" = 0/0/0 ] &&
    [ "$(count_re "$(out a; out b; out c)" "/6 port [0-9]+ attempt 1 sum 105 right")" = 6 ] &&
    contains "$(out a)" "attempt 0 ended: the node on $(hostname) joined"; then
    reformed=$((reformed + 1))
  else
    echo "# re-form run $run: exit $(rc a)/$(rc b)/$(rc c)"
    for n in a b c; do sed "s/^/#   $n| /" "$DIR/$n.out"; done
  fi
done
check "a third node arriving while 2 of 2:3 run, --max-restarts 0: re-formed in $reformed of 5 runs (attempt 1: 6 ranks, each sum 105; the cause named)" \
  equals $reformed 5
# A re-form is free: the closing line must not count it as a restart spent (--max-restarts 0).
check "the closing line counts the re-form as one, not as a restart" \
  contains "$(out a)" "succeeded on attempt 1 after 1 re-form (not counted as restarts)"
wait $handshake
took=$(cat "$DIR/handshake.took" 2>/dev/null || echo none)
check "a connection that never joins is closed by the rendezvous after $took ms (10 s)" \
  eval '[ "$took" != none ] && [ "$took" -ge 9500 ] && [ "$took" -le 11000 ]'
kill "$(agent_of $lone)" 2>/dev/null
wait $lone

# --- a frozen idist-run (SIGSTOP: its ranks run on, its heartbeats stop), default node_timeout -----
# Each connection's silence is checked at its own deadline: node 1 is declared dead at most 5 s
# (node_timeout) after its last heartbeat, so at most 5 s after the freeze (plus a little
# scheduling); a check once per heartbeat made that up to 6 s.
new_port
node a 2 --max-restarts 1 --grace 1 -- 400 25 5
wait_listening "$port"  # node a hosts: it binds the endpoint first
node b 2 --max-restarts 1 --grace 1 -- 400 25 5
pid_b=$NODE_PID
sleep 1.5
agent_b=$(agent_of $pid_b)
kill -STOP "$agent_b"
start=$(now_ms)
wait_line a "stopped answering" 15
took=$(($(now_ms) - start))
check "SIGSTOP of node 1's idist-run: node 0 declares it dead $took ms after the freeze (node_timeout 5 s: at most 5500)" \
  test $took -le 5500
kill -CONT "$agent_b"
wait
check "... node 0 exits 1, naming it" eval '[ "$(rc a)" = 1 ] && contains "$(out a)" \
  "node 1 ($(hostname)) stopped answering (no heartbeat for 5s); 1 node left, the job needs 2"'
check "... and node 1, thawed, finds its rendezvous gone and exits 1" \
  eval '[ "$(rc b)" = 1 ] && contains "$(out b)" "lost the rendezvous at 127.0.0.1:$port (node 0)"'

# --- a node that never finishes stopping its ranks -------------------------------------------------
# Node 1's console reads, but slowly: once the attempt ends its ranks are gone, but their output
# is still held for that console, so it never says "over" though its idist-run heartbeats on.
# Past its --grace (0.5 s) and a margin of 5 s it is dropped, and node 0 gets the verdict.
new_port
mkfifo "$DIR/slow"
python3 -c 'import sys, time
while sys.stdin.buffer.read(512): time.sleep(0.1)' <"$DIR/slow" &
reader=$!
start=$(now_ms)
node_running a 2 --grace 0.5 -- bash -c '[ "$RANK" = 0 ] && { sleep 1; exit 3; }; exec sleep 30'
pid_a=$NODE_PID
wait_listening "$port"  # node a hosts: it binds the endpoint first
(timeout 60 "$RUN" --nnodes 2 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "rdzv-test-$$" -n 2 --grace 0.5 \
   bash -c 'exec yes "$(printf %0200d 0)"' >"$DIR/slow" 2>"$DIR/b.out"
 echo $? >"$DIR/b.rc") &
wait $pid_a
took=$(($(now_ms) - start))
check "node 1 never reports its ranks stopped: node 0 has its verdict in $took ms (rank 0 fails at 1 s, + 0.5 s grace + 5 s: under 9000)" \
  eval '[ "$(rc a)" = 3 ] && [ $took -lt 9000 ]'
check "... naming the failure and the node dropped" contains "$(out a)" \
  "the job failed: rank 0 on node 0 ($(hostname)) exited with code 3; node 1 ($(hostname)) did not report its ranks stopped within 5.5s of attempt 0's end; 1 node left, the job needs 2"
kill "$reader"
wait
check "... node 1 hears why it was dropped" contains "$(out b)" \
  "refused this node: this node did not report its ranks stopped within 5.5s of attempt 0's end; dropped from the job"

# --- a node lost between attempts, fixed N: the job ends at once, not after join_timeout ----------
# Ranks that ignore SIGTERM: node 0 (--grace 3) takes 3 s to stop them after rank 0 fails, node 1
# (--grace 0.2) is done at once and frozen while it awaits the verdict (its ranks reaped, its
# "over" sent). When the restart verdict comes, node 1 cannot join attempt 1; killed then, it
# is lost between attempts.
new_port
prog='trap "" TERM; [ "$RANK" = 0 ] && [ "$IDIST_RESTART_COUNT" = 0 ] && { sleep 1; exit 3; }; sleep 30'
node_running a 2 --grace 3 --max-restarts 1 -- bash -c "$prog"
pid_a=$NODE_PID
wait_listening "$port"  # node a hosts: it binds the endpoint first
node_running b 2 --grace 0.2 --max-restarts 1 -- bash -c "$prog"
pid_b=$NODE_PID
wait_line b "stopping the ranks here"
agent_b=$(agent_of $pid_b)
for i in $(seq 100); do pgrep -P "$agent_b" >/dev/null || break; sleep 0.05; done
sleep 0.2
kill -STOP "$agent_b"
wait_line a "restarting every node"
kill -9 "$agent_b"
start=$(now_ms)
wait $pid_a
took=$(($(now_ms) - start))
wait
check "node 1 killed while the job gathers for attempt 1 (--nnodes 2): node 0 ends the job in $took ms (not join_timeout's 30 s), exit 1" \
  eval '[ "$(rc a)" = 1 ] && [ $took -lt 2000 ]'
check "... naming it" contains "$(out a)" \
  "before attempt 1 could start, node 1 ($(hostname)) was lost: its idist-run ended or was killed; 1 node left, the job needs 2" ||
  sed 's/^/#   a| /' "$DIR/a.out"

# --- a node that cannot start its ranks says so; the others name it with that cause ---------------
# Its --log-dir passes the check at start, then becomes a file while the round waits for a third
# node: the attempt's directory cannot be made, and no rank of it starts.
for bad in b a; do
  new_port
  mkdir -p "$DIR/logs_a" "$DIR/logs_b"
  node a 3 --log-dir "$DIR/logs_a" -- 200 25 5
  wait_listening "$port"  # node a hosts: it binds the endpoint first
  node b 3 --log-dir "$DIR/logs_b" -- 200 25 5
  sleep 0.5
  rm -rf "$DIR/logs_$bad" && touch "$DIR/logs_$bad"
  node c 3 -- 200 25 5
  wait
  rm -rf "$DIR/logs_a" "$DIR/logs_b"
  if [ $bad = b ]; then
    check "node 1 cannot create its attempt's log directory: the other nodes exit 1 naming node 1 and why" \
      eval '[ "$(rc a)/$(rc c)" = 1/1 ] && contains "$(out a; out c)" "attempt 0 ended: node 1 ($(hostname)) left the job: could not start every rank"'
  else
    check "node 0 cannot create its attempt's log directory: the other nodes exit 1 naming node 0 and why" \
      eval '[ "$(rc b)/$(rc c)" = 1/1 ] && contains "$(out b)" "node 0'"'"'s idist-run left the job: could not start every rank"'
  fi
done

# --- the endpoint's port held by another program -------------------------------------------------
new_port
# It says when it listens: under load python's start can take longer than any fixed pause, and
# a node started before would bind the port itself.
python3 -c 'import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
time.sleep(30)' "$port" >"$DIR/holder" &
holder=$!
for i in $(seq 200); do grep -q listening "$DIR/holder" && break; sleep 0.05; done
start=$(now_ms)
node a 2 -- 5 10 5
wait "$NODE_PID"
took=$(($(now_ms) - start))
kill $holder
wait
check "the endpoint's port held by a plain listener: exit 1 in $took ms (under 6000)" \
  eval '[ "$(rc a)" = 1 ] && [ $took -lt 6000 ]'
check "... with one line naming the endpoint and the cause" equals "$(out a)" \
  "idist-run: --rdzv-endpoint 127.0.0.1:$port: the port is in use by another program (not an idist rendezvous)"

# --- summary.json on every node: each attempt, and what ended it -------------------------------------
new_port
export JOB_SUM_CRASH="2:3"
node a 2 --max-restarts 1 --log-dir "$DIR/logs_a" -- 10 10 5
wait_listening "$port"  # node a hosts: it binds the endpoint first
node b 2 --max-restarts 1 --log-dir "$DIR/logs_b" -- 10 10 5
wait
unset JOB_SUM_CRASH
for n in a b; do
  summary=$(cat "$DIR"/logs_$n/*/summary.json 2>/dev/null)
  check "summary.json of node $n: attempt 0 ended by rank 2 on node 1, attempt 1 succeeded" \
    equals "$(jq -r '[.attempts[0].ended_by, (.attempts | length), .exit_code] | map(tostring) | join("|")' <<<"$summary")" \
    "rank 2 on node 1 ($(hostname)) exited with code 7|2|0" ||
    { echo "#   summary.json: $summary"; sed "s/^/#   $n| /" "$DIR/$n.out"; }
done

finish
