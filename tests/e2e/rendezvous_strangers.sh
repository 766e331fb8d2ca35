#!/bin/bash
# Strangers at node 0's rendezvous (issue 28): a flood of connections that speak another
# protocol is logged in a few lines a second, not a line each, and a node started with a
# mistyped --rdzv-id is named when the round times out, instead of "node 1 never joined" alone.
# Two idist-run "nodes" on loopback; the ranks never start (the round cannot close).
# usage: rendezvous_strangers.sh IDIST_RUN
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
DIR=$(mktemp -d /tmp/idist-rdzv-strangers.XXXXXX)
trap 'pkill -9 -f "rdzv-id rdzv-strangers-$$" 2>/dev/null; rm -rf "$DIR"' EXIT
port=$(random_port)
FLOOD=300

# Node 0 waits 12 s for a second node that never comes with the right id: long enough for the
# flood and node 1 to reach it on a loaded machine (with 4 s, a CI run's flood took longer,
# node 0 gave up first, and node 1 found nobody to refuse it).
(timeout 60 "$RUN" --nnodes 2 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "rdzv-strangers-$$" -n 1 \
   --rdzv-conf join_timeout=12 /bin/true >"$DIR/a.out" 2>&1
 echo $? >"$DIR/a.rc") &
node_a=$!
wait_listening "$port"

# The flood: each connection sends an HTTP request (read as a frame length far beyond ours)
# and hangs up.
for i in $(seq $FLOOD); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port" && printf 'GET / HTTP/1.1\r\nHost: x\r\n\r\n' >&3) 2>/dev/null
done

# Node 1, with a mistyped id: refused at once.
timeout 30 "$RUN" --nnodes 2 --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "rdzv-strangerz-$$" -n 1 \
  /bin/true >"$DIR/b.out" 2>&1
echo $? >"$DIR/b.rc"
wait $node_a

a=$(cat "$DIR/a.out")
b=$(cat "$DIR/b.out")
lines=$(grep -c "rendezvous: refused" <<<"$a" || true)
# "refused a connection from ..." is one; "refused N connections from ..." is N.
counted=$(grep -oE "rendezvous: refused ([0-9]+|a) connection" <<<"$a" |
  awk '{ n += ($3 == "a") ? 1 : $3 } END { print n + 0 }')
check "a flood of $FLOOD foreign connections and one of another job: $lines line(s) of refusals on node 0" \
  eval '[ "$lines" -ge 1 ] && [ "$lines" -le 10 ]' || echo "$a" | sed 's/^/#   a| /' | head -40
check "... that count every one of them ($counted of $((FLOOD + 1)))" equals "$counted" $((FLOOD + 1))
check "node 1 (mistyped --rdzv-id) is refused, told why, and fails" \
  eval '[ "$(cat "$DIR/b.rc")" != 0 ] && contains "$b" "wrong or missing job identity"' || echo "$b" | sed 's/^/#   b| /'
check "node 0 fails when the round times out" eval '[ "$(cat "$DIR/a.rc")" != 0 ]'
check "... naming the node that never joined and the connection refused for another job id" \
  eval 'contains "$a" "node 1 never joined; refused 1 connection from 127.0.0.1 with another job id (--rdzv-id)"' ||
  echo "$a" | grep -v "refused [0-9a]" | sed 's/^/#   a| /'
finish
