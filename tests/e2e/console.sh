#!/bin/bash
# idist-run's console, whatever its reader does: one that never reads must not hold up
# --timeout or SIGTERM (lines are dropped, counted and told once, the log files keep every
# byte); one that is slow but reads gets every byte; one that goes away (| head) costs no
# SIGPIPE; a terminal works and is not left non-blocking.
# usage: console.sh IDIST_RUN
source "$(dirname "$0")/lib.sh"
RUN=$1
RANKS="$(cd "$(dirname "$0")" && pwd)/ranks"
TMP=$(mktemp -d)
trap 'touch "$TMP/go"; rm -rf "$TMP"' EXIT
command -v jq >/dev/null || { echo "jq is missing"; exit 77; }

# A reader of FIFO $1 that takes nothing until file $2 exists, then copies everything to $3.
stalled_reader() {
  (while [ ! -e "$2" ]; do sleep 0.05; done; cat) <"$1" >"$3"
}
summary_of() { echo "$1"/*/summary.json; }
size_of() { cat "$@" | wc -c; }

# --- a console that never reads, and --timeout -------------------------------------------------
mkfifo "$TMP/fifo"
stalled_reader "$TMP/fifo" "$TMP/go" "$TMP/stall.console" &
reader=$!
mkdir "$TMP/stall"
start=$(now_ms)
"$RUN" --timeout 5 -n 2 --log-dir "$TMP/stall" "$RANKS/numbered_lines.sh" >"$TMP/fifo" 2>"$TMP/stall.err"
rc=$?
elapsed=$(($(now_ms) - start))
touch "$TMP/go"
wait $reader
json=$(summary_of "$TMP/stall")
dropped=$(jq .console_dropped.stdout.bytes "$json")
logged=$(size_of "$TMP"/stall/*/attempt_0/rank_*.out)
shown=$(size_of "$TMP/stall.console")
echo "  console that never reads, --timeout 5: idist-run exited after ${elapsed} ms (it used to wait for the reader);" \
  "$logged bytes logged, $shown shown, $dropped dropped"
check "stalled console: --timeout still ends the job (exit 124)" equals $rc 124
check "stalled console: within 3 s of the timeout" test $elapsed -lt 8000
check "stalled console: one notice, naming stdout and how much" \
  equals "$(grep -c "^idist-run: stdout: [0-9]* line(s), $dropped bytes not shown: its reader stopped reading" "$TMP/stall.err")" 1
check "stalled console: the notice says where every byte is" contains "$(cat "$TMP/stall.err")" "every byte is in $TMP/stall/"
check "stalled console: summary.json counts the dropped lines" test "$(jq .console_dropped.stdout.lines "$json")" -gt 0
check "stalled console: shown + dropped = logged, to the byte" equals $((shown + dropped)) "$logged"
check "stalled console: the exit status stays the job's (summary.json)" equals "$(jq .exit_code "$json")" 124
# Every line in each log, numbered 1, 2, 3, ... without a gap.
gapless() { awk '{ if ($4 != NR) { bad = 1; exit } } END { exit bad || NR == 0 }' "$1"; }
check "stalled console: rank 0's log has every line" gapless "$(echo "$TMP"/stall/*/attempt_0/rank_0.out)"
check "stalled console: rank 1's log has every line" gapless "$(echo "$TMP"/stall/*/attempt_0/rank_1.out)"
check "stalled console: no run leftovers" no_run_leftovers "$(jq -r .run_id "$json")"

# --- a console that never reads, and SIGTERM ------------------------------------------------------
rm -f "$TMP/go"
stalled_reader "$TMP/fifo" "$TMP/go" /dev/null &
reader=$!
"$RUN" -v -n 2 "$RANKS/numbered_lines.sh" >"$TMP/fifo" 2>"$TMP/term.err" &
pid=$!
sleep 1
start=$(now_ms)
kill -TERM $pid
wait $pid
rc=$?
elapsed=$(($(now_ms) - start))
touch "$TMP/go"
wait $reader
echo "  console that never reads, SIGTERM: idist-run exited ${elapsed} ms after it"
check "stalled console: SIGTERM still ends the job (exit 143)" equals $rc 143
check "stalled console: SIGTERM honoured within 2 s (the stall) and a little" test $elapsed -lt 3500
check "stalled console, SIGTERM: one notice" equals "$(grep -c '^idist-run: stdout: .* not shown: ' "$TMP/term.err")" 1
check "stalled console, SIGTERM: without --log-dir, the notice says how to keep every byte" \
  contains "$(cat "$TMP/term.err")" "run with --log-dir to keep every byte"
check "stalled console, SIGTERM: no run leftovers" no_run_leftovers "$(run_id_in "$TMP/term.err")"

# --- a reader that goes away: | head -1 ------------------------------------------------------------
mkdir "$TMP/head"
"$RUN" -n 2 --log-dir "$TMP/head" "$RANKS/chatty.sh" 2>"$TMP/head.err" | head -1 >"$TMP/head.out"
rc=${PIPESTATUS[0]}
json=$(summary_of "$TMP/head")
echo "  | head -1: exit $rc, $(jq .console_dropped.stdout.bytes "$json") bytes not shown"
check "| head -1: no SIGPIPE, the job's exit status (0)" equals $rc 0
check "| head -1: head got a whole line" grep -qxE 'A{300}|B{300}' "$TMP/head.out"
check "| head -1: one notice, the reader went away" \
  equals "$(grep -c '^idist-run: stdout: .* not shown: its reader went away (broken pipe); every byte is in ' "$TMP/head.err")" 1
check "| head -1: each log has all 3000 lines" equals "$(cat "$TMP"/head/*/attempt_0/rank_{0,1}.out | wc -l)" 6000
check "| head -1: summary.json: exit 0, stdout dropped" equals \
  "$(jq -c '[.exit_code, (.console_dropped.stdout.bytes > 0), .console_dropped.stderr.bytes]' "$json")" '[0,true,0]'

# --- a console that is slow but reads: every byte, nothing dropped ----------------------------------
head -c 4500000 /dev/urandom | base64 -w 99 >"$TMP/big.txt"   # 6 MB, more than idist-run holds (4 MiB)
cat >"$TMP/big.sh" <<EOF
#!/bin/bash
[ "\$RANK" = 0 ] && cat "$TMP/big.txt"
exit 0
EOF
chmod +x "$TMP/big.sh"
slow_reader() {  # 64 KiB, then a pause: about 3 MB/s
  local n
  while :; do
    n=$(dd bs=65536 count=1 status=none | tee -a "$1" | wc -c)
    [ "$n" = 0 ] && return
    sleep 0.02
  done
}
start=$(now_ms)
"$RUN" -n 2 "$TMP/big.sh" 2>"$TMP/slow.err" | slow_reader "$TMP/slow.out"
rc=${PIPESTATUS[0]}
elapsed=$(($(now_ms) - start))
echo "  a reader of about 3 MB/s: $(size_of "$TMP/slow.out") of $(size_of "$TMP/big.txt") bytes in ${elapsed} ms"
check "slow reader: exit 0" equals $rc 0
check "slow reader: every byte, in order" cmp -s "$TMP/big.txt" "$TMP/slow.out"
check "slow reader: nothing said about dropping" equals "$(grep -c 'not shown' "$TMP/slow.err")" 0

# --- stdout and stderr on one pipe (2>&1), read at once -------------------------------------------
out=$("$RUN" -n 2 --tag-output "$RANKS/chatty.sh" 2>&1)
check "2>&1 into a pipe: 6000 whole tagged lines" \
  equals "$(grep -cE '^(\[rank 0\] A{300}|\[rank 1\] B{300})$' <<<"$out")" 6000

# --- a terminal --------------------------------------------------------------------------------------
if command -v script >/dev/null && command -v python3 >/dev/null; then
  cat >"$TMP/tty.sh" <<EOF
"$RUN" -n 2 "$RANKS/chatty.sh"
echo "exit \$?"
python3 -c 'import fcntl, os; print("O_NONBLOCK", bool(fcntl.fcntl(1, fcntl.F_GETFL) & os.O_NONBLOCK), "tty", os.isatty(1))'
EOF
  script -qfec "bash $TMP/tty.sh" /dev/null >"$TMP/tty.out" 2>&1 </dev/null
  tr -d '\r' <"$TMP/tty.out" >"$TMP/tty.txt"
  check "terminal: 6000 whole lines, exit 0" equals \
    "$(grep -cE '^(A{300}|B{300})$' "$TMP/tty.txt") $(grep '^exit ' "$TMP/tty.txt")" "6000 exit 0"
  check "terminal: not left non-blocking for the shell" contains "$(cat "$TMP/tty.txt")" "O_NONBLOCK False tty True"
else
  echo "# SKIP: terminal case: script(1) or python3 missing"
fi

# A progress bar (tqdm's '\r' redraws, no newline for the whole run): each redraw shows while
# the rank runs, not at the line's end (each one goes at the next '\r': a redraw late).
"$RUN" -n 1 bash -c 'for i in 1 2 3; do printf "\rprogress %d" $i; sleep 1.5; done; echo' >"$TMP/bar.out" 2>&1 &
job=$!
sleep 2.5
check "a progress bar's first redraw is shown while the rank runs" grep -q "progress 1" "$TMP/bar.out"
wait $job
check "... and every redraw, then its newline (exit $?)" eval \
  '[ "$(tr "\r" "\n" <"$TMP/bar.out" | grep -c "^progress [123]$")" = 3 ]'

finish
