#!/bin/bash
# Live recovery on one host (issue 46, docs/RECOVERY.md): ranks of a job that opted in
# (InitOptions::recovery) are lost, by kill -9 (rank 0 included, whose store the others no
# longer need), by two kills at once, and frozen by SIGSTOP; the survivors keep their processes,
# re-form (idist::reform) and redo the step, and the job ends with exit 0, saying what was lost.
# With --recovery off the same loss ends the job as it always has.
# usage: reform.sh IDIST_RUN REFORM_RANK
source "$(dirname "$0")/lib.sh"
RUN=$(realpath "$1")
private_copy reform_rank "$2"

# start_job OUT N ARGS...: idist-run -n N ARGS in the background; waits until every rank printed its pid.
start_job() {
  local out=$1 n=$2
  shift
  : >"$out"
  "$RUN" -n "$@" >"$out" 2>&1 &
  job=$!
  for i in $(seq 400); do [ "$(grep -c "^origin [0-9]* pid" "$out")" -ge "$n" ] && break; sleep 0.05; done
}
# lose N SIGNAL ORIGIN ARGS...: a job of N ranks (ARGS before the program's), ORIGIN given
# SIGNAL ${DELAY:-0.6} s in; its output in $DIR/out, its exit status in $rc, and in $took the
# milliseconds from the signal to the job's end.
lose() {
  local n=$1 sig=$2 victim=$3 start
  shift 3
  start_job "$DIR/out" "$n" --timeout 90 "$@"
  sleep "${DELAY:-0.6}"
  start=$(now_ms)
  kill "-$sig" "$(pid_of "$DIR/out" "$victim")"
  wait $job
  rc=$?
  took=$(($(now_ms) - start))
}
pid_of() { awk -v r="$2" '$1 == "origin" && $2 == r && $3 == "pid" {print $4; exit}' "$1"; }
# The survivors' pids as they re-formed: the same processes as at the start.
same_processes() {
  local out=$1 origin
  shift
  for origin in "$@"; do
    grep -q "^origin $origin pid $(pid_of "$out" "$origin"): generation" "$out" || return 1
  done
}

# kill -9 of rank 1 of 4, mid-run: 3 go on, exit 0, one step redone.
lose 4 9 1 --log-dir "$DIR/logs" "$PROG" 60 30
check "kill -9 of rank 1 of 4: the job ends with exit 0 (got $rc)" test "$rc" = 0 || cat "$DIR/out"
check "... ranks 0, 2 and 3 re-formed in their own processes" same_processes "$DIR/out" 0 2 3
check "... as a world of 3, ranks renumbered" grep -q "^origin 3 pid [0-9]*: generation 1: rank 3 -> 2 of 3, lost 1," "$DIR/out"
check "... each survivor's redone step completed within 2 s of the loss" eval \
  'awk "/redone [0-9.]+ ms after the loss/ { n++; if (\$6 + 0 >= 2000) bad = 1 } END { exit !(n == 3 && !bad) }" "$DIR/out"' ||
  grep "after the loss" "$DIR/out"
check "... every step done, one redone, sums right" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=3 sum=" "$DIR/out"
check "... idist-run says so" grep -qE "succeeded after 1 re-form \(rank 1 was killed by SIGKILL; world 4 -> 3\)" "$DIR/out"
check "... and summary.json keeps it" eval \
  'python3 -c "import json,glob,sys; s=json.load(open(glob.glob(\"$DIR/logs/*/summary.json\")[0])); sys.exit(0 if s[\"attempts\"][0][\"reforms\"]==[\"rank 1 was killed by SIGKILL; world 4 -> 3\"] and s[\"exit_code\"]==0 else 1)"'
check "... with how long the re-form took: every member joined within 2 s of the loss" eval \
  'python3 -c "import json,glob,sys; s=json.load(open(glob.glob(\"$DIR/logs/*/summary.json\")[0])); t=s[\"attempts\"][0][\"reform_seconds\"]; print(\"  # reform_seconds:\", t); sys.exit(0 if len(t)==1 and 0 < t[0] < 2 else 1)"'

# --max-restarts 1 with a program that calls reform() itself and never admits a replacement: none
# is started (it would wait in init() to the job's end), and the job goes on as 2.
lose 3 9 1 --max-restarts 1 "$PROG" 60 30
check "--max-restarts 1, a program that admits no replacement: exit 0 (got $rc)" test "$rc" = 0 || cat "$DIR/out"
check "... no rank started in rank 1's place, and idist-run says why" eval \
  '! grep -q "starts in rank 1.s place" "$DIR/out" && grep -q "rank 1 is not replaced: 2 of the 2 ranks left do not admit replacements" "$DIR/out"' ||
  grep "live recovery" "$DIR/out"
check "... ranks 0 and 2 finish as a world of 2" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/out"

# --status after a re-form says the generation and its world.
start_job "$DIR/out" 3 --timeout 90 "$PROG" 120 30
sleep 0.6
kill -9 "$(pid_of "$DIR/out" 1)"
for i in $(seq 100); do grep -q "^origin [0-9]* pid [0-9]*: generation 1" "$DIR/out" && break; sleep 0.05; done
"$RUN" --status $job >"$DIR/status" 2>&1
wait $job
rc=$?
check "--status after a re-form: live recovery's generation and world (exit $rc)" eval \
  '[ $rc = 0 ] && grep -q "^live recovery: generation 1, a world of 2" "$DIR/status"' || cat "$DIR/status"

# The same over gloo's TCP (shared memory carries a job on one host by default).
IDIST_INTRANODE=off lose 3 9 1 "$PROG" 60 30
check "over TCP (IDIST_INTRANODE=off), kill -9 of rank 1 of 3: exit 0 (got $rc)" test "$rc" = 0 || cat "$DIR/out"
check "... ranks 0 and 2 finish as a world of 2" eval \
  'same_processes "$DIR/out" 0 2 && grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/out"'

# kill -9 of rank 0, which hosted the job's first store.
lose 3 9 0 "$PROG" 60 30
check "kill -9 of rank 0 of 3: exit 0 (got $rc)" test "$rc" = 0 || cat "$DIR/out"
check "... ranks 1 and 2 go on as 0 and 1" eval \
  'same_processes "$DIR/out" 1 2 && grep -q "^origin 1 pid [0-9]*: generation 1: rank 1 -> 0 of 2, lost 0," "$DIR/out"'
check "... and the new rank 0 ends the run" grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/out"

# Two ranks killed 5 ms apart: one re-form (or two), never a lost step.
start_job "$DIR/out" 4 --timeout 90 "$PROG" 60 30
sleep 0.6
kill -9 "$(pid_of "$DIR/out" 1)"
sleep 0.005
kill -9 "$(pid_of "$DIR/out" 2)"
wait $job
rc=$?
check "two kills 5 ms apart: exit 0 (got $rc)" test "$rc" = 0 || cat "$DIR/out"
check "... ranks 0 and 3 finish as a world of 2" eval \
  'same_processes "$DIR/out" 0 3 && grep -qE "^reform_rank: done steps=60 redone=[12] reforms=[12] world=2 sum=" "$DIR/out"'

# A loss during the re-form: rank 2 is slow to re-form (500 ms) and is killed while ranks 0
# and 3 connect generation 1 without it; they give that generation up for the next at once,
# rather than wait for rank 2 until IDIST_TIMEOUT (set to 60 s here).
REFORM_RANK_SLOW=2 IDIST_TIMEOUT=60 start_job "$DIR/out" 4 --timeout 90 "$PROG" 60 30
sleep 0.6
kill -9 "$(pid_of "$DIR/out" 1)"
sleep 0.3
start=$(now_ms)
kill -9 "$(pid_of "$DIR/out" 2)"
wait $job
rc=$?
took=$(($(now_ms) - start))
check "a second loss while the survivors re-form: exit 0 (got $rc) $took ms after it (bound 10000)" \
  eval '[ $rc = 0 ] && [ $took -lt 10000 ]' || cat "$DIR/out"
check "... ranks 0 and 3 go on as a world of 2, the step redone once" eval \
  'grep -q "^origin 3 pid $(pid_of "$DIR/out" 3): generation 2: rank 3 -> 1 of 2, lost 1,2," "$DIR/out" &&
   grep -q "^reform_rank: done steps=60 redone=1 reforms=1 world=2 sum=" "$DIR/out"'

# Rank 2 frozen (SIGSTOP): stopped by the heartbeat watch, then re-formed around.
lose 3 STOP 2 --heartbeat-timeout 1 "$PROG" 80 30
check "rank 2 frozen by SIGSTOP: exit 0 (got $rc)" test "$rc" = 0 || cat "$DIR/out"
check "... it was stopped as frozen and the others went on" eval \
  'grep -q "rank 2 (pid [0-9]*) is frozen" "$DIR/out" && grep -q "^reform_rank: done steps=80 redone=1 reforms=1 world=2 sum=" "$DIR/out"'

# A rank lost after the last step, while the others wait in finalize(): nothing can redo its
# part, so the job fails, and at once (not after IDIST_TIMEOUT, 60 s here).
DELAY=1.2 REFORM_RANK_LATE=1 IDIST_TIMEOUT=60 lose 3 9 1 "$PROG" 10 30
check "a rank lost while the others finalize: the job fails (exit $rc) $took ms later (bound 10000)" \
  eval '[ $rc != 0 ] && [ $took -lt 10000 ]' || cat "$DIR/out"
check "... rank 0 says why" grep -q "finalize(.*): a rank was lost while the ranks finalized" "$DIR/out"

# A rank that ends its program early (exit 0: uneven steps) is not a loss: the job fails at
# once, naming the uneven steps (the leaver's finalize() hears it left a peer waiting; a
# survivor in reform() hears from idist-run that the rank ended), never after IDIST_TIMEOUT.
start=$(now_ms)
REFORM_RANK_SHORT=1 IDIST_TIMEOUT=60 "$RUN" -n 3 --timeout 90 "$PROG" 40 30 >"$DIR/out" 2>&1
rc=$?
took=$(($(now_ms) - start))
check "a rank that ends early (exit 0): the job fails (exit $rc) in $took ms (bound 15000), naming uneven steps" eval \
  '[ $rc != 0 ] && [ $took -lt 15000 ] &&
   grep -qE "ran different numbers of steps|rank 1 ended its program \(exit 0\) while this rank waited" "$DIR/out"' ||
  cat "$DIR/out"

start=$(now_ms)
REFORM_RANK_SHORT=1 REFORM_RANK_NO_FINALIZE=1 IDIST_TIMEOUT=60 "$RUN" -n 3 --timeout 90 "$PROG" 40 30 >"$DIR/out" 2>&1
rc=$?
took=$(($(now_ms) - start))
check "... and one that exits 0 without finalize(): fails (exit $rc) in $took ms (bound 15000), the others naming it" \
  eval '[ $rc != 0 ] && [ $took -lt 15000 ] &&
        grep -q "rank 1 ended its program (exit 0) while this rank waited for it" "$DIR/out"' || cat "$DIR/out"

# --min-world 3 of 3: a loss would leave too few, so the attempt ends, saying why.
lose 3 9 1 --min-world 3 "$PROG" 60 30
check "--min-world 3, a loss of 3 ranks: the job fails (exit $rc), naming rank 1 and why it did not re-form" eval \
  '[ $rc != 0 ] && grep -q "rank 1 (pid [0-9]* on [^)]*) was killed by SIGKILL" "$DIR/out" &&
   grep -q "live recovery: the attempt ends: 2 ranks would be left, fewer than --min-world 3" "$DIR/out"' || cat "$DIR/out"

# --recovery off: the same kill ends the job, as it always has.
lose 3 9 1 --recovery off "$PROG" 60 30
check "--recovery off: the kill ends the job (exit $rc)" eval '[ $rc != 0 ] && ! grep -q "generation 1" "$DIR/out"' ||
  cat "$DIR/out"
check "... naming rank 1" grep -q "rank 1 (pid [0-9]* on [^)]*) was killed by SIGKILL" "$DIR/out"

finish
