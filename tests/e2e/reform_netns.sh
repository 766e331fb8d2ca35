#!/bin/bash
# Live recovery over two hosts (issue 46, docs/RECOVERY.md): network namespaces on one bridge,
# 2 ranks each, meeting at the built-in rendezvous on host 0 (node 0). A rank killed on either
# host (rank 0 included), or the whole of host 1 (its idist-run, which takes its ranks with it),
# costs one step: the survivors keep their processes, re-form through the generations' store
# node 0's rendezvous hosts, and every node still running ends with exit 0, saying what was
# lost. With --recovery off the same loss ends the job as it always has.
# usage: reform_netns.sh IDIST_RUN REFORM_RANK     exits 77 (skipped) without namespaces
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
private_copy reform_rank "$2"
tag=$$
trap 'pkill -CONT -f "^$PROG " 2>/dev/null; pkill -9 -f "rdzv-id reform-$tag" 2>/dev/null; pkill -9 -f "^$PROG " 2>/dev/null; netns_hosts_cleanup; rm -rf "$DIR"' EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 2; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root, iproute2, unshare, CAP_NET_ADMIN)"
  exit 77
fi
export IDIST_TIMEOUT=30
NAMES=(alpha bravo)
EP=${ADDR_HOST[0]}:29500

# start I [idist-run options...]: host I's idist-run of reform_rank (60 steps of 30 ms) in the
# background, its output in $DIR/hI.out and its exit code in $DIR/hI.rc; $agent_I its pid.
start() {
  local i=$1
  shift
  rm -f "$DIR/h$i.rc"
  : >"$DIR/h$i.out"
  (on_host "$i" "${NAMES[i]}" timeout 90 "$RUN" --nnodes 2 --node-rank "$i" --rdzv-endpoint "$EP" \
     --rdzv-id "reform-$tag" -n 2 --grace 1 "$@" "$PROG" 60 30 >"$DIR/h$i.out" 2>&1
   echo $? >"$DIR/h$i.rc") &
}
agent_of() { pgrep -o -f "^$RUN --nnodes 2 --node-rank $1 --rdzv-endpoint $EP --rdzv-id reform-$tag"; }
# run_and_lose VICTIM [options...]: both hosts, and once every rank printed its pid (and ${DELAY:-0.6} s
# more), kill -9 of VICTIM: an origin rank, or "node0"/"node1" (that host's idist-run). Waits for the end.
run_and_lose() {
  local victim=$1 i
  shift
  start 0 "$@"
  start 1 "$@"
  wait_for_origins 4
  sleep "${DELAY:-0.6}"
  if [ "$victim" = node1 ] || [ "$victim" = node0 ]; then
    kill -9 "$(agent_of "${victim#node}")"
  else
    kill -9 "$(origin_pid "$victim")"
  fi
  wait
}

# A rank of host 1 (rank 3 of 4): the others go on as a world of 3, on both hosts.
run_and_lose 3
check "kill -9 of rank 3 (host 1) of 4: both hosts end with exit 0 (got $(host_rc 0)/$(host_rc 1))" equals "$(host_rc 0)/$(host_rc 1)" 0/0 || show_hosts
check "... ranks 0, 1 and 2 re-formed in their own processes" same_processes 0 1 2
check "... every step done, one redone, as a world of 3" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=3 sum=" "$DIR/h0.out"
echo "# each survivor's redone step, from the loss it saw (ms): $(cat "$DIR"/h*.out | awk '/redone [0-9.]+ ms after the loss/ { printf "%s ", $6 }')"
check "... each survivor's redone step completed within 2 s of the loss" eval \
  'cat "$DIR"/h*.out | awk "/redone [0-9.]+ ms after the loss/ { n++; if (\$6 + 0 >= 2000) bad = 1 } END { exit !(n == 3 && !bad) }"'
check "... host 0's idist-run says what was lost" grep -q "succeeded after 1 re-form (rank 3 on node 1 (bravo) was killed by SIGKILL; world 4 -> 3)" "$DIR/h0.out"
check "... and so does host 1's" grep -q "succeeded after 1 re-form (rank 3 on node 1 (bravo) was killed by SIGKILL; world 4 -> 3)" "$DIR/h1.out"

# Rank 0 (host 0): its node hosts the store, not its rank, so the job goes on.
run_and_lose 0
check "kill -9 of rank 0 (host 0): exit 0 on both hosts (got $(host_rc 0)/$(host_rc 1))" equals "$(host_rc 0)/$(host_rc 1)" 0/0 || show_hosts
check "... ranks 1, 2 and 3 re-formed in their own processes" same_processes 1 2 3
check "... every step done, one redone" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=3 sum=" "$DIR/h0.out"

# A rank frozen (SIGSTOP) on host 1: its idist-run stops it after --heartbeat-timeout and
# reports the loss, and the job goes on as after a kill.
start 0 --heartbeat-timeout 1
start 1 --heartbeat-timeout 1
wait_for_origins 4
sleep 0.6
kill -STOP "$(origin_pid 2)"
wait
check "rank 2 (host 1) frozen: both hosts end with exit 0 (got $(host_rc 0)/$(host_rc 1))" equals "$(host_rc 0)/$(host_rc 1)" 0/0 || show_hosts
check "... ranks 0, 1 and 3 re-formed in their own processes, every step done, one redone" eval \
  'same_processes 0 1 3 && grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=3 sum=" "$DIR/h0.out"'
check "... host 1's idist-run named it frozen" grep -q "rank 2 (pid [0-9]*) is frozen: no heartbeat" "$DIR/h1.out"

# The whole of host 1: its idist-run killed, its ranks with it (PDEATHSIG).
run_and_lose node1
check "kill -9 of host 1's idist-run: host 0 ends with exit 0 (got $(host_rc 0))" equals "$(host_rc 0)" 0 || show_hosts
check "... ranks 0 and 1 re-formed in their own processes" same_processes 0 1
check "... as a world of 2, every step done, one redone" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/h0.out"
check "... idist-run names the lost node" grep -qE "succeeded after 1 re-form \(node 1 \(bravo\) was lost: its idist-run ended or was killed; world 4 -> 2\)" "$DIR/h0.out"

# Host 1 goes silent: its cable cut (no reset, no FIN reaches anyone), then the same with host 1
# frozen whole (its idist-run and ranks under SIGSTOP). Nothing ends the survivors' connections
# to its ranks: the rendezvous drops host 1 after node_timeout (2 s here) and announces a
# generation without it, and the survivors' own watch of that store aborts their collective.
silent=(--rdzv-conf heartbeat=0.5,node_timeout=2)
start 0 "${silent[@]}"
start 1 "${silent[@]}"
wait_for_origins 4
sleep 0.6
netns_cut 1
wait
check "host 1's cable cut: host 0 ends with exit 0 (got $(host_rc 0))" equals "$(host_rc 0)" 0 || show_hosts
check "... ranks 0 and 1 re-formed in their own processes, every step done" eval \
  'same_processes 0 1 && grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/h0.out"'
check "... the lost node named for its silence" grep -qE "succeeded after 1 re-form \(node 1 \(bravo\) stopped answering" "$DIR/h0.out"
check "... host 1, cut off, stops its ranks and fails, naming the lost rendezvous (got $(host_rc 1))" eval \
  '[ "$(host_rc 1)" != 0 ] && grep -q "lost the rendezvous" "$DIR/h1.out"'
ip -n "$NS_BRIDGE" link set "b1-$tag" up

start 0 "${silent[@]}"
start 1 "${silent[@]}"
wait_for_origins 4
sleep 0.6
frozen=$(agent_of 1)
frozen="$frozen $(origin_pid 2) $(origin_pid 3)"
kill -STOP $frozen
wait_for_lines "$DIR/h0.out" "reform_rank: done" 1
kill -CONT $frozen
wait
check "host 1 frozen whole: host 0 ends with exit 0 (got $(host_rc 0))" equals "$(host_rc 0)" 0 || show_hosts
check "... every step done as a world of 2" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/h0.out"
check "... host 1, continued, fails (got $(host_rc 1)), its ranks stopped or fenced out, never counted" eval \
  '[ "$(host_rc 1)" != 0 ] && ! grep -q "reform_rank: done" "$DIR/h1.out"'

# Node 0's idist-run killed: it hosted the rendezvous and the generations' store, so host 1
# stops its ranks and fails, saying that live recovery cannot survive node 0.
run_and_lose node0
check "kill -9 of host 0's idist-run: host 1 fails (got $(host_rc 1)), saying recovery cannot survive node 0" eval \
  '[ "$(host_rc 1)" != 0 ] && grep -q "live recovery cannot go on without node 0" "$DIR/h1.out"' || show_hosts

# --recovery off: the loss ends the attempt on both hosts, as without live recovery.
run_and_lose 3 --recovery off
check "--recovery off: kill -9 of rank 3 fails the job on both hosts (got $(host_rc 0)/$(host_rc 1))" eval '[ "$(host_rc 0)" != 0 ] && [ "$(host_rc 1)" != 0 ]'
check "... naming the lost rank" grep -q "rank 3 on node 1 (bravo) was killed by SIGKILL" "$DIR/h0.out"
finish
