#!/bin/bash
# Spawn mode when things go wrong: the failure summary, helpers that ranks leave behind,
# --timeout, --max-restarts, --log-dir and summary.json, output that must survive a rank's
# SIGKILL, whole tagged lines, forwarded signals. After every case, no process of the run
# (found by its IDIST_RUN_ID) may be left.
# usage: failure_handling.sh IDIST_RUN
source "$(dirname "$0")/lib.sh"
RUN=$1
RANKS="$(cd "$(dirname "$0")" && pwd)/ranks"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; pkill -KILL -f "sleep 1000$MARKER" 2>/dev/null' EXIT
command -v jq >/dev/null || { echo "jq is missing"; exit 77; }

# --- the summary: failing rank, host, collateral ranks, last lines of its stderr ------------
"$RUN" -v -n 3 "$RANKS/stderr_tail.sh" >"$TMP/tail.out" 2>"$TMP/tail.err"
rc=$?
err=$(cat "$TMP/tail.err")
check "exit code is the failing rank's (5)" equals $rc 5
check "summary names rank, pid and host" contains "$err" "idist-run: rank 1 (pid "
check "summary names the host" contains "$err" " on $(hostname)) exited with code 5; stopped rank(s) 0, 2"
check "summary shows the stderr tail" contains "$err" "idist-run: last lines of rank 1's stderr:"
check "the tail ends with the last line" contains "$err" "idist-run:   | rank 1 complaint 15"
check "the tail has the last 10 lines" equals "$(grep -c 'idist-run:   | rank 1 complaint' <<<"$err")" 10
check "the tail starts at line 6" contains "$err" "| rank 1 complaint 6"
check "no run leftovers (stderr tail)" no_run_leftovers "$(run_id_in "$TMP/tail.err")"

# --- helpers a rank leaves behind: double-forked, own session, deaf to SIGTERM -----------------
start=$(now_ms)
"$RUN" -v -n 2 --grace 1 "$RANKS/leave_helper.sh" 4 >"$TMP/helper.out" 2>"$TMP/helper.err"
rc=$?
elapsed=$(($(now_ms) - start))
echo "  failing rank with SIGTERM-deaf helpers, --grace 1: done after ${elapsed} ms"
check "helpers: exit code of the failure (4)" equals $rc 4
check "helpers: done within the grace period and a little" test $elapsed -lt 4000
check "helpers: no run leftovers after a failure" no_run_leftovers "$(run_id_in "$TMP/helper.err")"
check "helpers: no sleeping helper left" no_leftovers

"$RUN" -v -n 2 --grace 1 "$RANKS/leave_helper.sh" 0 >"$TMP/helper0.out" 2>"$TMP/helper0.err"
rc=$?
check "helpers left by successful ranks: exit 0" equals $rc 0
check "helpers left by successful ranks are killed too" no_run_leftovers "$(run_id_in "$TMP/helper0.err")"

# A helper that ignores SIGTERM holds the job's end for --grace: said while it waits, and what
# was killed in the end.
start=$(now_ms)
"$RUN" -n 1 --grace 3 "$RANKS/leave_helper.sh" 0 >"$TMP/helper3.out" 2>"$TMP/helper3.err"
rc=$?
elapsed=$(($(now_ms) - start))
check "a SIGTERM-deaf helper: exit 0, after --grace 3 (${elapsed} ms)" eval '[ $rc = 0 ] && [ $elapsed -ge 2900 ] && [ $elapsed -lt 5000 ]'
check "... the wait is said as it begins" contains "$(cat "$TMP/helper3.err")" "did not end on SIGTERM; killing it in 2s (--grace)"
check "... and what was killed" grep -qE "killed pid [0-9]+ \(sleep\) left behind by the ranks \(--grace 3s after SIGTERM\)" "$TMP/helper3.err"

# A rank the kernel's OOM killer kills: named as such, not as a plain SIGKILL. In a memory
# cgroup of our own with a 64 MiB limit (cgroup v1's memory controller, or v2's), where root may make one.
oom_cgroup() {
  local v1 v2 g
  v1=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
  if [ -n "$v1" ] && [ -d "/sys/fs/cgroup/memory$v1" ]; then
    g=/sys/fs/cgroup/memory$v1/idist-oom-$$
    mkdir "$g" 2>/dev/null && echo 64M >"$g/memory.limit_in_bytes" 2>/dev/null || { rmdir "$g" 2>/dev/null; return 1; }
    [ -e "$g/memory.memsw.limit_in_bytes" ] && echo 64M >"$g/memory.memsw.limit_in_bytes" 2>/dev/null
    echo "$g"
    return 0
  fi
  v2=$(awk -F: '$1 == 0 {print $3}' /proc/self/cgroup)
  g=/sys/fs/cgroup${v2%/}/idist-oom-$$
  mkdir "$g" 2>/dev/null && echo 64M >"$g/memory.max" 2>/dev/null && echo 0 >"$g/memory.swap.max" 2>/dev/null &&
    { echo "$g"; return 0; }
  rmdir "$g" 2>/dev/null
  return 1
}
if cg=$(oom_cgroup); then
  bash -c 'echo $$ >"$1/cgroup.procs" && exec "${@:2}"' _ "$cg" "$RUN" -n 1 "$RANKS/use_memory.sh" 256 \
    >"$TMP/oom.out" 2>"$TMP/oom.err"
  rc=$?
  check "a rank killed for memory: exit 137" equals $rc 137
  check "... named as the OOM killer's" contains "$(cat "$TMP/oom.err")" "was killed by SIGKILL (the kernel's OOM killer: out of memory)" ||
    sed 's/^/  | /' "$TMP/oom.err"
  rmdir "$cg" 2>/dev/null
else
  echo "SKIP - an OOM-killed rank: no memory cgroup can be made here (not root, or no memory controller)"
fi

# --- an orphan that ends while the job runs is reaped by us (the subreaper), not left a zombie ---
"$RUN" -v -n 2 "$RANKS/orphan_helper.sh" 2 >"$TMP/orphan.out" 2>"$TMP/orphan.err" &
pid=$!
wait_for_lines "$TMP/orphan.out" " up" 2
sleep 1
zombies=$(ps --ppid $pid -o stat= | grep -c '^Z')
children=$(ps --ppid $pid -o pid= | wc -l)
check "orphaned helpers that ended are reaped while the job runs (no zombie)" equals "$zombies" 0
check "... and only the 2 ranks are left as our children" equals "$children" 2
wait $pid
check "orphaned helpers: exit 0" equals $? 0
check "orphaned helpers: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/orphan.err")"

# --- --timeout --------------------------------------------------------------------------------
start=$(now_ms)
"$RUN" -v -n 2 --timeout 1 "$RANKS/sleep_forever.sh" >"$TMP/timeout.out" 2>"$TMP/timeout.err"
rc=$?
elapsed=$(($(now_ms) - start))
echo "  --timeout 1: done after ${elapsed} ms"
check "--timeout: exit 124" equals $rc 124
check "--timeout: summary says so" contains "$(cat "$TMP/timeout.err")" "idist-run: timed out after 1s; stopped rank(s) 0, 1"
check "--timeout: after about a second" test $elapsed -ge 1000 -a $elapsed -lt 3000
check "--timeout: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/timeout.err")"

# --- --max-restarts: fails twice, then succeeds ------------------------------------------------
mkdir "$TMP/restart"
"$RUN" -n 2 --max-restarts 2 --log-dir "$TMP/restart" "$RANKS/fail_until_attempt.sh" 2 >"$TMP/restart.out" 2>"$TMP/restart.err"
rc=$?
id=$(ls "$TMP/restart")
json="$TMP/restart/$id/summary.json"
out=$(cat "$TMP/restart.out")
err=$(cat "$TMP/restart.err")
check "--max-restarts 2, two failures: exit 0" equals $rc 0
check "every attempt ran both ranks" equals "$(grep -c '^attempt [012] rank [01] MASTER_PORT=' <<<"$out")" 6
check "each attempt has its own MASTER_PORT" equals "$(grep -o 'attempt [012] .*MASTER_PORT=[0-9]*' <<<"$out" | sed 's/ rank [01]//' | sort -u | cut -d= -f2 | sort -u | wc -l)" 3
check "summary: attempt 0 failed, restarting" contains "$err" "idist-run: attempt 0: rank 0 (pid "
check "summary: attempt 0 says restarting" contains "$err" "exited with code 9; stopped rank(s) 1; restarting every rank (attempt 1 of at most 3)"
check "summary: attempt 1 failed, restarting" contains "$err" "restarting every rank (attempt 2 of at most 3)"
check "summary: success on attempt 2" contains "$err" "succeeded on attempt 2 after 2 restarts"
check "summary.json: 3 attempts" equals "$(jq '.attempts | length' "$json")" 3
check "summary.json: 3 different master ports" equals "$(jq '[.attempts[].master_port] | unique | length' "$json")" 3
check "summary.json: ports match what the ranks saw" equals \
  "$(jq -r '.attempts[] | "\(.attempt) \(.master_port)"' "$json" | tr '\n' ' ')" \
  "$(grep '^attempt [012] rank 0 ' <<<"$out" | sed 's/^attempt \([0-9]\) rank 0 MASTER_PORT=/\1 /' | sort | tr '\n' ' ')"
check "summary.json: first failures 0, 0, none" equals "$(jq -c '[.attempts[].first_failure]' "$json")" "[0,0,null]"
check "summary.json: exit code 0" equals "$(jq '.exit_code' "$json")" 0
check "per-attempt log directories" test -s "$TMP/restart/$id/attempt_1/rank_0.err" -a -f "$TMP/restart/$id/attempt_2/rank_1.out"
check "--max-restarts: no run leftovers" no_run_leftovers "$id"

# --- --max-restarts exhausted --------------------------------------------------------------------
mkdir "$TMP/exhausted"
"$RUN" -n 2 --max-restarts 1 --log-dir "$TMP/exhausted" "$RANKS/fail_until_attempt.sh" 5 >/dev/null 2>"$TMP/exhausted.err"
rc=$?
id=$(ls "$TMP/exhausted")
check "--max-restarts exhausted: the failure's exit code (9)" equals $rc 9
check "--max-restarts exhausted: said so" contains "$(cat "$TMP/exhausted.err")" "idist-run: attempt 1: rank 0 (pid "
check "--max-restarts exhausted: no restarts left" contains "$(cat "$TMP/exhausted.err")" "no restarts left (--max-restarts 1)"
check "--max-restarts exhausted: 2 attempts in summary.json" equals "$(jq '.attempts | length' "$TMP/exhausted/$id/summary.json")" 2
check "--max-restarts exhausted: no run leftovers" no_run_leftovers "$id"

# --- --log-dir: tee to files, summary.json ------------------------------------------------------
mkdir "$TMP/logs"
out=$("$RUN" -n 3 --log-dir "$TMP/logs" "$RANKS/fail_rank1.sh" 2>&1)
rc=$?
id=$(ls "$TMP/logs")
dir="$TMP/logs/$id"
json="$dir/summary.json"
check "--log-dir: exit code 3" equals $rc 3
check "--log-dir: the console still shows the rank's output" contains "$out" "rank 1 about to fail"
check "--log-dir: rank 1's stdout file" equals "$(cat "$dir/attempt_0/rank_1.out")" "rank 1 about to fail"
check "--log-dir: rank 1's stderr file, byte for byte" equals "$(od -c <"$dir/attempt_0/rank_1.err")" "$(printf 'last words without newline' | od -c)"
check "--log-dir: a file per rank and stream" equals "$(ls "$dir/attempt_0" | tr '\n' ' ')" "rank_0.err rank_0.out rank_1.err rank_1.out rank_2.err rank_2.out "
check "--log-dir: the console says where the logs are" contains "$out" "logs and summary.json in $dir"
check "summary.json: run id" equals "$(jq -r .run_id "$json")" "$id"
check "summary.json: exit code 3" equals "$(jq .exit_code "$json")" 3
check "summary.json: outcome" equals "$(jq -r .outcome "$json")" "rank 1 exited with code 3"
check "summary.json: first failure is rank 1" equals "$(jq '.attempts[0].first_failure' "$json")" 1
check "summary.json: rank 1 exited 3, not collateral" equals \
  "$(jq -c '.attempts[0].ranks[1] | [.rank, .exit_code, .signal, .core_dumped, .collateral, .first_failure]' "$json")" '[1,3,null,false,false,true]'
check "summary.json: ranks 0 and 2 collateral, SIGTERM" equals \
  "$(jq -c '[.attempts[0].ranks[] | select(.collateral) | [.rank, .exit_code, .signal]]' "$json")" '[[0,null,"SIGTERM"],[2,null,"SIGTERM"]]'
check "summary.json: pids and hosts" equals "$(jq -r '[.attempts[0].ranks[] | select(.pid > 1 and .host == "'"$(hostname)"'")] | length' "$json")" 3
iso='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$'
check "summary.json: ISO 8601 start and end times" equals \
  "$(jq -r '.attempts[0].ranks[] | .start, .end' "$json" | grep -cE "$iso")" 6
check "summary.json: a rank ends after it starts" equals \
  "$(jq '[.attempts[0].ranks[] | select(.end >= .start)] | length' "$json")" 3
# Milliseconds of the day from an ISO 8601 time; enough for differences within a test.
ms='def ms: (.[11:13] | tonumber) * 3600000 + (.[14:16] | tonumber) * 60000 + (.[17:23] | tonumber) * 1000;'
lag=$(jq "$ms"' .attempts[0] | (.ranks[1].end | ms) as $failed | [.ranks[] | select(.collateral) | (.end | ms) - $failed] | max | round' "$json")
echo "  the last collateral rank ended ${lag} ms after the failing one"
check "summary.json: the others are stopped within milliseconds of the failure" test "$lag" -lt 500
check "--log-dir: no run leftovers" no_run_leftovers "$id"
mkdir "$TMP/segv"
"$RUN" -n 1 --log-dir "$TMP/segv" "$RANKS/segfault_rank0.sh" >/dev/null 2>&1
check "summary.json: a signal by name" equals \
  "$(jq -c '.attempts[0].ranks[0] | [.exit_code, .signal]' "$TMP/segv"/*/summary.json)" '[null,"SIGSEGV"]'

# --- every byte a rank writes before SIGKILL reaches the console and the log ------------------
head -c 3750000 /dev/urandom | base64 -w 76 | head -c 5000000 >"$TMP/big.txt"   # ~5 MB, no final newline
head -c 700000 /dev/urandom | base64 -w 120 | head -c 900000 >"$TMP/big_err.txt"
mkdir "$TMP/big"
"$RUN" -n 2 --log-dir "$TMP/big" "$RANKS/write_then_die.sh" "$TMP/big.txt" "$TMP/big_err.txt" >"$TMP/big.out" 2>"$TMP/big.err"
rc=$?
id=$(ls "$TMP/big")
check "writer killed by SIGKILL: exit 137" equals $rc 137
check "log file: every stdout byte" cmp -s "$TMP/big.txt" "$TMP/big/$id/attempt_0/rank_0.out"
check "log file: every stderr byte" cmp -s "$TMP/big_err.txt" "$TMP/big/$id/attempt_0/rank_0.err"
check "console: every stdout byte, the partial last line ended by a newline" \
  equals "$(md5sum <"$TMP/big.out")" "$( (cat "$TMP/big.txt"; echo) | md5sum)"
check "console: every stderr byte before the summary" \
  equals "$(head -c $(( $(stat -c %s "$TMP/big_err.txt") + 1 )) "$TMP/big.err" | md5sum)" "$( (cat "$TMP/big_err.txt"; echo) | md5sum)"
echo "  $(stat -c %s "$TMP/big.txt") + $(stat -c %s "$TMP/big_err.txt") bytes written; console got $(stat -c %s "$TMP/big.out") + $(stat -c %s "$TMP/big.err")"
check "big writer: no run leftovers" no_run_leftovers "$id"

# --- --tag-output: 4 ranks, long lines at once, never mixed ---------------------------------------
"$RUN" -v -n 4 --tag-output "$RANKS/long_lines.sh" >"$TMP/tag.out" 2>"$TMP/tag.err"
rc=$?
check "4 chatty ranks: exit 0" equals $rc 0
check "2000 lines arrive" equals "$(wc -l <"$TMP/tag.out")" 2000
# (awk rather than grep -E 'A{9000}': such a regex takes grep many seconds to compile)
whole_lines() {
  awk '/^\[rank [0-3]\] / { letter = substr("ABCD", substr($0, 7, 1) + 1, 1); body = substr($0, 10); n = length(body);
       if ((n == 3000 || n == 9000) && gsub(letter, "", body) == n) ok++ } END { print ok + 0 }' "$1"
}
check "every line is whole and tagged with its own rank" equals "$(whole_lines "$TMP/tag.out")" 2000
check "500 lines from each rank" equals "$(cut -c1-8 "$TMP/tag.out" | sort | uniq -c | awk '{print $1}' | sort -u)" 500
check "--tag-output: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/tag.err")"

# --- forwarded signals: USR1 by default, configurable ------------------------------------------------
# The ranks go on until they got both signals (30 s at most), never a fixed time that a loaded
# machine could run out before the second signal lands.
"$RUN" -v -n 2 "$RANKS/trap_signals.sh" 30 USR1 USR2 >"$TMP/usr.out" 2>"$TMP/usr.err" &
pid=$!
wait_for_lines "$TMP/usr.out" " up" 2
kill -USR1 $pid
wait_for_lines "$TMP/usr.out" "got USR1" 2
kill -USR2 $pid
wait $pid
rc=$?
check "USR1 and USR2 forwarded, the job goes on and ends well" equals $rc 0
check "both ranks got USR1" equals "$(grep -c 'got USR1' "$TMP/usr.out")" 2
check "both ranks got USR2" equals "$(grep -c 'got USR2' "$TMP/usr.out")" 2
check "both ranks went on to the end" equals "$(grep -c ' done$' "$TMP/usr.out")" 2
check "forwarded signals: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/usr.err")"

"$RUN" -v -n 2 --forward-signals term,SIGUSR2 "$RANKS/trap_signals.sh" 30 TERM USR2 >"$TMP/fwd.out" 2>"$TMP/fwd.err" &
pid=$!
wait_for_lines "$TMP/fwd.out" " up" 2
kill -TERM $pid
wait_for_lines "$TMP/fwd.out" "got TERM" 2
kill -USR2 $pid
wait $pid
rc=$?
check "--forward-signals term,SIGUSR2: SIGTERM forwarded, job goes on" equals $rc 0
check "--forward-signals: both ranks got TERM" equals "$(grep -c 'got TERM' "$TMP/fwd.out")" 2
check "--forward-signals: both ranks got USR2" equals "$(grep -c 'got USR2' "$TMP/fwd.out")" 2
check "--forward-signals: both ranks went on to the end" equals "$(grep -c ' done$' "$TMP/fwd.out")" 2
check "--forward-signals: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/fwd.err")"

"$RUN" -v -n 2 --forward-signals USR2 "$RANKS/trap_signals.sh" 20 >"$TMP/nofwd.out" 2>"$TMP/nofwd.err" &
pid=$!
wait_for_lines "$TMP/nofwd.out" " up" 2
kill -USR1 $pid
wait $pid
rc=$?
check "USR1 not in the list: it stops the job, 128+10" equals $rc 138
check "USR1 not in the list: summary" contains "$(cat "$TMP/nofwd.err")" "interrupted by SIGUSR1; stopped rank(s) 0, 1"
check "USR1 not in the list: not forwarded" equals "$(grep -c 'got USR1' "$TMP/nofwd.out")" 0
check "USR1 not in the list: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/nofwd.err")"

# A forwarded signal that the ranks do not handle kills them: a failure, never exit 0.
"$RUN" -v -n 2 "$RANKS/sleep_forever.sh" >"$TMP/usr1kill.out" 2>"$TMP/usr1kill.err" &
pid=$!
wait_for_lines "$TMP/usr1kill.out" " up" 2
kill -USR1 $pid
wait $pid
rc=$?
check "ranks killed by a forwarded USR1: exit 128+10" equals $rc 138
check "ranks killed by a forwarded USR1: the summary says so" \
  grep -qE '^idist-run: rank [01] \(pid [0-9]+ on .*\) was killed by SIGUSR1' "$TMP/usr1kill.err"
check "ranks killed by a forwarded USR1: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/usr1kill.err")"

# --- a second Ctrl-C kills at once -------------------------------------------------------------------
"$RUN" -v -n 2 --grace 30 "$RANKS/deaf.sh" >"$TMP/twice.out" 2>"$TMP/twice.err" &
pid=$!
wait_for_lines "$TMP/twice.out" " up" 2
kill -INT $pid
sleep 0.3
check "SIGINT-deaf ranks outlive the first SIGINT" kill -0 $pid
start=$(now_ms)
kill -INT $pid
wait $pid
rc=$?
elapsed=$(($(now_ms) - start))
echo "  second SIGINT: idist-run done after ${elapsed} ms"
check "a second SIGINT kills at once (not after --grace 30)" test $elapsed -lt 2000
check "a second SIGINT: exit 128+2 of the first" equals $rc 130
check "a second SIGINT: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/twice.err")"

# --- one Ctrl-C delivered twice (the terminal's, and timeout's forward of it): the grace holds ----
"$RUN" -v -n 2 --grace 30 "$RANKS/deaf.sh" >"$TMP/dup.out" 2>"$TMP/dup.err" &
pid=$!
wait_for_lines "$TMP/dup.out" " up" 2
kill -INT $pid; kill -INT $pid
sleep 0.5
check "one SIGINT delivered twice within 0.2 s: the ranks still have their grace" kill -0 $pid
check "... and it is not taken for a second Ctrl-C" eval '! grep -q "again: killing" "$TMP/dup.err"'
kill -INT $pid  # now a second Ctrl-C
wait $pid
check "... a later SIGINT still kills at once (exit 130)" equals $? 130

# --- bad values: one line naming the option, exit 2 ------------------------------------------------
bad() {
  local what=$1 expect=$2
  shift 2
  local err rc
  err=$("$RUN" "$@" 2>&1 >/dev/null)
  rc=$?
  check "$what: exit 2" equals $rc 2
  check "$what: one line naming $expect" test "$(wc -l <<<"$err")" = 1 -a -n "$(grep -F -- "$expect" <<<"$err")"
}
bad "--forward-signals USR1,BOGUS" "--forward-signals" --forward-signals USR1,BOGUS /bin/true
bad "--forward-signals KILL" "--forward-signals" --forward-signals KILL /bin/true
bad "--timeout 0" "--timeout" --timeout 0 /bin/true
bad "--timeout abc" "--timeout" --timeout abc /bin/true
bad "--grace nan" "--grace: 'nan' is not a number of seconds" --grace nan /bin/true
bad "--stall-timeout nan" "--stall-timeout: 'nan' is not a number" --stall-timeout nan /bin/true
bad "--stall-timeout 1e-9 (0 to the timers: off without a word)" "under a millisecond" --stall-timeout 1e-9 /bin/true
bad "--max-restarts -1" "--max-restarts" --max-restarts -1 /bin/true
bad "--log-dir under a file" "--log-dir" --log-dir "$TMP/big.txt/sub" /bin/true

finish
