#!/bin/bash
# A peer that dies or freezes, as the survivors see it through libidist:
#  1. kill -9 of one rank among many small all_reduces, over gloo's TCP and over shared memory:
#     no survivor dies of SIGPIPE (the
#     library ignores it unless the program handles it), and a survivor's error names the
#     dead rank ("connection to rank 2 lost") rather than only an address; over shared memory
#     with ranks started by hand, every survivor names it within a second;
#  2. a rank SIGSTOPped at every moment of start-up (joining the store, connecting gloo's
#     pairs, the first collectives): the others fail within IDIST_TIMEOUT plus a small slack,
#     never Gloo's 5x connect timeout, and name the stopped rank.
# usage: peer_death.sh IDIST_RUN JOB_SUM
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
JOB_SUM=$(realpath "$2")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# pid_of_rank ROUNDS VALUE R: the job_sum process of rank R in the job summing VALUE.
pid_of_rank() {
  local p
  for p in $(pgrep -f "$JOB_SUM $1 0 $2\$"); do
    grep -qzx "RANK=$3" /proc/$p/environ 2>/dev/null && { echo $p; return; }
  done
}

# kill_runs LABEL ROUNDS: 8 jobs of 3 ranks doing ROUNDS small all_reduces back to back, one
# rank killed 0.8 s in; the transport comes from IDIST_INTRANODE in the caller's environment.
# Shared memory does a round in about a microsecond, so its jobs get far more rounds to be
# still running when the kill lands.
kill_runs() {
  local label=$1 rounds=$2
  local runs=8 sigpipe=0 named=0 unnamed=0 wrong_rank=0 zero_exit=0 typed=0 i victim value job pid
  for i in $(seq $runs); do
    victim=$((i % 3))
    value=$((500 + i))
    "$RUN" -n 3 --tag-output "$JOB_SUM" "$rounds" 0 $value >"$TMP/out" 2>&1 &
    job=$!
    sleep 0.8
    pid=$(pid_of_rank "$rounds" $value $victim)
    [ -n "$pid" ] && kill -KILL "$pid"
    wait $job
    [ $? = 0 ] && zero_exit=$((zero_exit + 1))
    grep -q "SIGPIPE" "$TMP/out" && { sigpipe=$((sigpipe + 1)); sed 's/^/  | /' "$TMP/out" | tail -5; }
    # Survivors that failed before idist-run stopped them: each names whom it lost.
    while read -r line; do
      case $line in
        *"connection to rank $victim lost"*) named=$((named + 1)) ;;
        *"connection to rank "*" lost"*) wrong_rank=$((wrong_rank + 1)) ;;  # a survivor that already failed: collateral
        *"connection to a peer lost"*) unnamed=$((unnamed + 1)) ;;
      esac
    done < <(grep -o "\[idist rank [0-9]/3\] all_reduce(gloo): connection to [a-z0-9 ]* lost" "$TMP/out")
    typed=$((typed + $(grep -c "job_sum: PeerLostError lost_rank=$victim\$" "$TMP/out")))
  done
  echo "  $label: $runs jobs with a rank killed mid-run: survivors killed by SIGPIPE in $sigpipe; survivor errors naming the dead rank: $named, another (already failed) rank: $wrong_rank, only an address: $unnamed"
  check "$label, kill -9 of a rank: no survivor dies of SIGPIPE ($sigpipe of $runs jobs)" equals $sigpipe 0
  check "$label, kill -9 of a rank: every job exits non-zero" equals $zero_exit 0
  # idist-run stops the survivors at once, and most are gone before they report (over TCP 0-2
  # of 16 report, measured on 2 cores, as before live recovery): where any reports, one names
  # the dead rank. Where nothing stops them (the runs by hand below), every survivor names it.
  [ "$label" = "shared memory" ] ||
    check "$label, kill -9 of a rank: survivors' errors name the dead rank ($named named, $wrong_rank another)" \
      eval '[ $named -gt 0 ] || [ $((wrong_rank + unnamed)) = 0 ]'
  check "$label, kill -9 of a rank: no survivor's error names only an address ($unnamed do)" equals $unnamed 0
  # The error's type and lost_rank() say the same as its words, for a program that recovers.
  check "$label, kill -9 of a rank: each error naming the dead rank is a PeerLostError with its rank ($typed of $named)" \
    test $typed -ge $named
}
IDIST_INTRANODE=off kill_runs "gloo over TCP" 100000
kill_runs "shared memory" 50000000

# The same over shared memory with nobody to stop the survivors (ranks started by hand, as
# under a scheduler that waits for every task): each must fail on its own, at once, naming
# the dead rank. Under idist-run they often cannot: a dead peer over shared memory is known
# from its exit, the very moment idist-run learns it and stops them (over TCP the peer's
# sockets close a little earlier, while it is still exiting).
runs=8 named=0 late=0 typed=0
for i in $(seq $runs); do
  victim=$((i % 3))
  port=$(random_port)
  for r in 0 1 2; do
    env -u IDIST_JOB_TOKEN RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port "$JOB_SUM" 50000000 0 $((700 + i)) >"$TMP/r$r" 2>&1 &
    eval "p$r=$!"
  done
  sleep 1.5  # past init(), into the all_reduces
  eval "kill -KILL \$p$victim"
  start=$(now_ms)
  for r in 0 1 2; do
    [ $r = $victim ] && { eval "wait \$p$r" 2>/dev/null; continue; }
    eval "wait \$p$r"
    [ $(($(now_ms) - start)) -gt 1000 ] && late=$((late + 1))
    grep -q "all_reduce(gloo): connection to rank $victim lost: it exited while this rank waited for it in all_reduce (shared memory)" "$TMP/r$r" &&
      named=$((named + 1))
    grep -q "^job_sum: PeerLostError lost_rank=$victim\$" "$TMP/r$r" && typed=$((typed + 1))
  done
done
echo "  shared memory, ranks by hand: $runs jobs with a rank killed mid-run: $named of $((2 * runs)) survivors name it, $late took over 1 s"
check "shared memory, ranks by hand, kill -9 of a rank: every survivor fails naming it ($named of $((2 * runs)))" equals $named $((2 * runs))
check "... within a second ($late late)" equals $late 0
check "... each a PeerLostError whose lost_rank() is the dead rank ($typed of $((2 * runs)))" equals $typed $((2 * runs))

# Start-up: rank 2 stopped after DELAY s, for delays across joining, connecting and computing.
T=2
worst=0 late=0 silent=0 tried=0
for delay in 0.01 0.02 0.03 0.04 0.05 0.06 0.08 0.1; do
  port=$(random_port)
  start=$(now_ms)
  for r in 0 1 2; do
    env -u IDIST_JOB_TOKEN RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port IDIST_TIMEOUT=$T \
      "$JOB_SUM" 20 5 1 >"$TMP/r$r" 2>&1 &
    eval "p$r=$!"
  done
  sleep $delay
  kill -STOP $p2 2>/dev/null
  wait $p0; rc0=$?; t0=$(($(now_ms) - start))
  wait $p1; rc1=$?; t1=$(($(now_ms) - start))
  kill -KILL $p2 2>/dev/null; wait $p2 2>/dev/null
  [ $rc0 = 0 ] && [ $rc1 = 0 ] && continue  # rank 2 was already done: nothing to see
  tried=$((tried + 1))
  for t in $t0 $t1; do [ $t -gt $worst ] && worst=$t; done
  [ $t0 -gt $((T * 1000 + 3000)) ] || [ $t1 -gt $((T * 1000 + 3000)) ] && late=$((late + 1))
  # In init() the stopped rank must be named. Once collectives run, a survivor may time out
  # first and take the blame of the others ("who did not arrive" is the flight recorder's job).
  if grep -q "init(gloo)" "$TMP/r0" "$TMP/r1" && ! cat "$TMP/r0" "$TMP/r1" | grep -qE "rank 2\b|ranks [0-9, ]*2\b"; then
    silent=$((silent + 1))
    echo "  delay $delay: neither survivor names rank 2: $(tail -1 "$TMP/r0") / $(tail -1 "$TMP/r1")"
  fi
done
echo "  rank 2 stopped during start-up at $tried moments: the others failed within $worst ms at IDIST_TIMEOUT=$T (Gloo alone: up to 5 x $T s to connect)"
check "a stopped rank at start-up: the others fail within IDIST_TIMEOUT + 3 s every time ($late late of $tried)" equals $late 0
check "... and, failing in init(), name rank 2 ($silent of $tried do not)" equals $silent 0
check "... the stop landed in $tried runs" test $tried -gt 3

# 3. A rank that returns 0 in the middle of the job (before the others' next all_reduce): the
# others fail, and idist-run names the early exit as the cause, on both transports.
for intranode in shm off; do
  out=$(JOB_SUM_CRASH=1:3 JOB_SUM_EXIT=0 IDIST_INTRANODE=$intranode timeout 60 "$RUN" -n 3 "$JOB_SUM" 20 25 5 2>&1)
  rc=$?
  check "rank 1 returns 0 mid-job (IDIST_INTRANODE=$intranode): the job fails (exit $rc), naming the early exit" eval \
    '[ $rc -ne 0 ] && [ $rc -ne 124 ] && contains "$out" "rank 1 had exited with code 0 while the others still ran"' ||
    sed 's/^/  | /' <<<"$out"
done
finish
