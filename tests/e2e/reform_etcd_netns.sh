#!/bin/bash
# Live recovery on the etcd rendezvous (issue 46, docs/RECOVERY.md): two network-namespace hosts,
# 2 ranks each, on one etcd member in a third. No node hosts the job: each idist-run hosts its
# own ranks' generations store, and the node that proposes writes each generation into etcd's
# state, naming the store its world connects through. So losing node 0 whole (its idist-run,
# its ranks with it) is survived like any other loss: the other host's ranks keep their pids.
# usage: reform_etcd_netns.sh IDIST_RUN REFORM_RANK     exits 77 (skipped) without namespaces or etcd
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
private_copy reform_rank "$2"
skip_without_etcd
tag=$$
ETCD_PID=
trap 'kill -9 $ETCD_PID 2>/dev/null; pkill -9 -f "rdzv-id reform-etcd-$tag" 2>/dev/null; pkill -9 -f "^$PROG " 2>/dev/null; netns_hosts_cleanup; rm -rf "$DIR"' EXIT
if ! command -v unshare >/dev/null || ! netns_hosts $tag 4; then
  echo "SKIP: cannot create network namespaces on a bridge here (needs root, iproute2, unshare, CAP_NET_ADMIN)"
  exit 77
fi
export IDIST_TIMEOUT=30
NAMES=(alpha bravo charlie)
check "etcd is up on host 3" netns_etcd 3
EP=$ETCD_EP
run=0

# start I [idist-run options...]: host I's idist-run of reform_rank (60 steps of 30 ms) in the
# background, its output in $DIR/hI.out and its exit code in $DIR/hI.rc. A node gone silent is
# found when its lease expires: node_timeout 2 s ($CONF); a killed one at once.
CONF=heartbeat=0.5,node_timeout=2
start() {
  local i=$1
  shift
  rm -f "$DIR/h$i.rc"
  : >"$DIR/h$i.out"
  (on_host "$i" "${NAMES[i]}" timeout 90 "$RUN" --rdzv-backend etcd --nnodes "${NNODES:-2}" --rdzv-endpoint "$EP" \
     --rdzv-id "reform-etcd-$tag-$run" ${CONF:+--rdzv-conf "$CONF"} -n "${NPROC[i]:-2}" --grace 1 "$@" \
     "$PROG" "${STEPS:-60}" 30 >"$DIR/h$i.out" 2>&1
   echo $? >"$DIR/h$i.rc") &
}
# run_and_lose VICTIM [options...]: both hosts, and once every rank printed its pid (and 0.6 s
# more), kill -9 of VICTIM: an origin rank, or "host0"/"host1" (that host's idist-run; etcd
# orders the nodes of a first attempt by host name, so alpha's is node 0).
run_and_lose() {
  local victim=$1 i
  shift
  run=$((run + 1))
  start 0 "$@"
  start 1 "$@"
  wait_for_origins 4
  sleep 0.6
  # Where the test needs a kill seen at once: until host WATCHING holds its connection to the
  # victim's store (with -v, idist-run says so), which a loaded machine may take longer to make.
  if [ -n "${WATCHING:-}" ]; then wait_for_line "$DIR/h$WATCHING.out" "store watch: watching node" 30; fi
  if [ "${victim#host}" != "$victim" ]; then
    kill -9 $(agent_of "${victim#host}")
  else
    kill -9 "$(origin_pid "$victim")"
  fi
  wait
}
agent_of() { idist_run_on_host "$1" "rdzv-id reform-etcd-$tag-$run "; }

# A rank of host 1 (rank 3 of 4): the others go on as a world of 3, on both hosts, and end
# with a monitored barrier, which collects in the store that world connects through (host 0's).
REFORM_RANK_MONITORED=1 run_and_lose 3
check "etcd: kill -9 of rank 3 (host 1) of 4: both hosts end with exit 0 (got $(host_rc 0)/$(host_rc 1))" equals "$(host_rc 0)/$(host_rc 1)" 0/0 || show_hosts
check "... ranks 0, 1 and 2 re-formed in their own processes" same_processes 0 1 2
check "... every step done, one redone, as a world of 3" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=3 sum=" "$DIR/h0.out"
check "... both hosts' idist-run say what was lost" eval \
  'grep -q "succeeded after 1 re-form (rank 3 on node 1 (bravo) was killed by SIGKILL; world 4 -> 3)" "$DIR/h0.out" &&
   grep -q "succeeded after 1 re-form (rank 3 on node 1 (bravo) was killed by SIGKILL; world 4 -> 3)" "$DIR/h1.out"'

# Host 0's idist-run (node 0: rank 0's store, and the proposer, having started first) killed,
# its ranks with it, at etcd's default node_timeout of 5 s: its store's connection ends at
# once, so host 1 revokes its lease and its ranks go on as a world of 2 without waiting for it.
CONF= WATCHING=1 run_and_lose host0 -v
check "etcd: kill -9 of node 0's idist-run: host 1 ends with exit 0 (got $(host_rc 1))" equals "$(host_rc 1)" 0 || show_hosts
check "... ranks 2 and 3 re-formed in their own processes" same_processes 2 3
check "... as a world of 2, every step done, one redone" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/h1.out"
check "... idist-run names the lost node" grep -qE "succeeded after 1 re-form \(node 0 \(alpha\) was lost: its idist-run ended or was killed .*; world 4 -> 2\)" "$DIR/h1.out"
echo "# each survivor's redone step, from the loss it saw (ms): $(awk '/redone [0-9.]+ ms after the loss/ { printf "%s ", $6 }' "$DIR/h1.out")"
check "... each survivor's redone step completed within 2 s of the loss (no lease TTL waited for)" eval \
  'awk "/redone [0-9.]+ ms after the loss/ { n++; if (\$6 + 0 >= 2000) bad = 1 } END { exit !(n == 2 && !bad) }" "$DIR/h1.out"'

# Host 1's idist-run killed: the proposer (node 0) holds its store, and finds it gone at once;
# `idist-run --status` on host 0 then names the generation.
run=$((run + 1))
CONF= STEPS=150 start 0
CONF= STEPS=150 start 1
wait_for_origins 4
sleep 0.6
kill -9 $(agent_of 1)
wait_for_lines "$DIR/h0.out" ": generation 1:" 2
status=$(ip netns exec "${NS_HOST[0]}" "$RUN" --status "$(agent_of 0)" 2>&1)
wait
check "etcd: kill -9 of node 1's idist-run: host 0 ends with exit 0 (got $(host_rc 0))" equals "$(host_rc 0)" 0 || show_hosts
check "... ranks 0 and 1 re-formed in their own processes, as a world of 2" eval \
  'same_processes 0 1 && grep -q "^reform_rank: done steps=150 redone=1 reforms=1 world=2 sum=" "$DIR/h0.out"'
check "... within 2 s of the loss, named" eval \
  'awk "/redone [0-9.]+ ms after the loss/ { n++; if (\$6 + 0 >= 2000) bad = 1 } END { exit !(n == 2 && !bad) }" "$DIR/h0.out" &&
   grep -qE "node 1 \(bravo\) was lost: its idist-run ended or was killed" "$DIR/h0.out"'
check "... --status on host 0 names the generation the job went on as" \
  grep -q "live recovery: generation 1 (node 1 (bravo) was lost: .*; world 4 -> 2)" <<<"$status" || echo "$status" | tail -5

# Host 1 frozen whole (its idist-run and ranks under SIGSTOP): nothing closes, so its lease
# expires after node_timeout, and host 0 goes on; continued, host 1 fails, its ranks fenced out.
run=$((run + 1))
start 0
start 1
wait_for_origins 4
sleep 0.6
frozen="$(agent_of 1) $(origin_pid 2) $(origin_pid 3)"
kill -STOP $frozen
wait_for_lines "$DIR/h0.out" "reform_rank: done" 1
kill -CONT $frozen
wait
check "etcd: host 1 frozen whole: host 0 ends with exit 0 (got $(host_rc 0))" equals "$(host_rc 0)" 0 || show_hosts
check "... every step done as a world of 2, named for its lease" eval \
  'grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/h0.out" &&
   grep -qE "succeeded after 1 re-form \(node 1 \(bravo\) was lost: its etcd lease expired" "$DIR/h0.out"'
check "... host 1, continued, fails (got $(host_rc 1)), its ranks never counted" eval \
  '[ "$(host_rc 1)" != 0 ] && ! grep -q "reform_rank: done" "$DIR/h1.out"'

# Rank 0 alone: the job goes on, rank 0's store no longer needed.
run_and_lose 0
check "etcd: kill -9 of rank 0 (host 0): exit 0 on both hosts (got $(host_rc 0)/$(host_rc 1))" equals "$(host_rc 0)/$(host_rc 1)" 0/0 || show_hosts
check "... ranks 1, 2 and 3 re-formed in their own processes, every step done, one redone" eval \
  'same_processes 1 2 3 && grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=3 sum=" "$DIR/h0.out"'

# Three nodes of 1, 2 and 2 ranks: node 0's only rank and node 2's idist-run killed together.
# Node 0's idist-run, its ranks all lost, stays to the end and says the job went on without them.
run=$((run + 1))
NNODES=3 NPROC=(1 2 2)
for i in 0 1 2; do start $i; done
wait_for_origins 5
sleep 0.6
kill -9 "$(origin_pid 0)" $(agent_of 2)
wait
check "etcd, 3 nodes: rank 0 (node 0's only rank) and node 2 killed together: nodes 0 and 1 exit 0 (got $(host_rc 0)/$(host_rc 1))" \
  equals "$(host_rc 0)/$(host_rc 1)" 0/0 || show_hosts
check "... ranks 1 and 2 re-formed in their own processes, as a world of 2" eval \
  'same_processes 1 2 && grep -q "^reform_rank: done steps=60 redone=1 reforms=[12] world=2 sum=" "$DIR/h1.out"'
check "... node 0 names both losses" grep -qE "succeeded after [12] re-forms? \(.*rank 0 on node 0 \(alpha\) was killed by SIGKILL" "$DIR/h0.out"
NNODES=2 NPROC=()
rm -f "$DIR/h2.out" "$DIR/h2.rc"  # the two-host cases count and read every host's lines

# --recovery off: the loss ends the attempt on both hosts, as without live recovery.
run_and_lose 3 --recovery off
check "etcd, --recovery off: kill -9 of rank 3 fails the job on both hosts (got $(host_rc 0)/$(host_rc 1))" eval '[ "$(host_rc 0)" != 0 ] && [ "$(host_rc 1)" != 0 ]'
check "... naming the lost rank" grep -q "rank 3 on node 1 (bravo) was killed by SIGKILL" "$DIR/h0.out"
finish
