#!/bin/bash
# idist-run as a supervisor: failures, signals, kill -9, the env contract, and output.
# usage: supervision.sh IDIST_RUN
source "$(dirname "$0")/lib.sh"
RUN=$1
RANKS="$(cd "$(dirname "$0")" && pwd)/ranks"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"; pkill -KILL -f "sleep 1000$MARKER" 2>/dev/null' EXIT

# --- a rank that exits 3 --------------------------------------------------------------
start=$(now_ms)
out=$("$RUN" -v -n 3 "$RANKS/fail_rank1.sh" 2>&1)
rc=$?
elapsed=$(($(now_ms) - start))
echo "  rank 1 exits 3: idist-run returned $rc after ${elapsed} ms"
check "exit code is the failing rank's (3)" equals $rc 3
check "noticed and torn down within seconds" test $elapsed -lt 5000
check "summary names the failing rank" contains "$out" "idist-run: rank 1 (pid "
check "summary gives the exit code" contains "$out" "exited with code 3; stopped rank(s) 0, 2"
# A line of its own: the summary's stderr tail quotes it too, after "idist-run:   | ".
check "the rank's unfinished last line is not lost" grep -qx "last words without newline" <<<"$out"
check "the rank's stdout is not lost" contains "$out" "rank 1 about to fail"
check "no rank left running" no_leftovers
check "no process of the run left" no_run_leftovers "$(grep -o 'run id [^ ]*' <<<"$out" | cut -d' ' -f3)"

# --- a rank killed by a signal ---------------------------------------------------------
out=$("$RUN" -v -n 2 "$RANKS/segfault_rank0.sh" 2>&1)
rc=$?
check "a rank killed by SIGSEGV: exit 128+11" equals $rc 139
check "summary names the signal" contains "$out" "rank 0 (pid"
check "summary says SIGSEGV" contains "$out" "was killed by SIGSEGV"
check "no rank left running after SIGSEGV" no_leftovers
check "no process of the run left after SIGSEGV" no_run_leftovers "$(grep -o 'run id [^ ]*' <<<"$out" | cut -d' ' -f3)"

# --- ranks that ignore SIGTERM get SIGKILL after the grace period ---------------------
start=$(now_ms)
"$RUN" -v -n 3 --grace 1 "$RANKS/ignore_term.sh" >/dev/null 2>"$TMP/ignore_term.err"
rc=$?
elapsed=$(($(now_ms) - start))
echo "  ranks ignoring SIGTERM, --grace 1: done after ${elapsed} ms"
check "SIGTERM-deaf ranks: exit code of the failure (1)" equals $rc 1
check "SIGKILL came after the grace period, not never" test $elapsed -lt 6000
check "no SIGTERM-deaf rank left" no_leftovers
check "no process of the SIGTERM-deaf run left" no_run_leftovers "$(run_id_in "$TMP/ignore_term.err")"

# --- SIGTERM and SIGINT to idist-run ---------------------------------------------------
for sig in TERM INT HUP; do
  "$RUN" -v -n 3 "$RANKS/sleep_forever.sh" >"$TMP/out.$sig" 2>&1 &
  pid=$!
  wait_for_lines "$TMP/out.$sig" " up" 3
  kill -$sig $pid
  wait $pid
  rc=$?
  num=$(kill -l $sig)
  check "SIG$sig to idist-run: exit 128+$num" equals $rc $((128 + num))
  check "SIG$sig to idist-run: summary" contains "$(cat "$TMP/out.$sig")" "interrupted by SIG$sig"
  check "SIG$sig to idist-run: every rank gone" no_leftovers
  check "SIG$sig to idist-run: no process of the run left" no_run_leftovers "$(run_id_in "$TMP/out.$sig")"
done

# --- SIGUSR1 is forwarded and the job goes on -----------------------------------------
cat >"$TMP/usr1.sh" <<'RANK'
#!/bin/bash
trap 'echo "rank $RANK got USR1"; exit 0' USR1
echo "rank $RANK up"
for _ in $(seq 100); do sleep 0.1; done
exit 1
RANK
chmod +x "$TMP/usr1.sh"
"$RUN" -v -n 2 "$TMP/usr1.sh" >"$TMP/out.usr1" 2>&1 &
pid=$!
wait_for_lines "$TMP/out.usr1" " up" 2
kill -USR1 $pid
wait $pid
rc=$?
check "SIGUSR1 reaches every rank, which then exit 0" equals $rc 0
check "SIGUSR1 seen by both ranks" equals "$(grep -c 'got USR1' "$TMP/out.usr1")" 2
check "SIGUSR1: no process of the run left" no_run_leftovers "$(run_id_in "$TMP/out.usr1")"

# --- kill -9 of idist-run takes the ranks down (PR_SET_PDEATHSIG) ----------------------
"$RUN" -v -n 3 "$RANKS/sleep_forever.sh" >"$TMP/out.kill" 2>&1 &
pid=$!
wait_for_lines "$TMP/out.kill" " up" 3
check "ranks are running before kill -9" ranks_running
kill -9 $pid
wait $pid 2>/dev/null
check "kill -9 of idist-run: every rank gone" no_leftovers
check "kill -9 of idist-run: no process of the run left" no_run_leftovers "$(run_id_in "$TMP/out.kill")"

# ... and what the ranks forked into sessions of their own: idist-run's guardian, a process
# outside its tree, sees it die and kills whatever still carries this idist-run's
# IDIST_SUPERVISOR marker.
"$RUN" -v -n 2 "$RANKS/escape_then_sleep.sh" >"$TMP/out.kill2" 2>&1 &
pid=$!
wait_for_lines "$TMP/out.kill2" " up" 2
# Each sleep is exec'd a moment after its "up".
for i in $(seq 100); do [ "$(pgrep -fc "sleep 1000$MARKER")" = 4 ] && break; sleep 0.05; done
check "2 ranks and 2 escaped helpers are running before kill -9" equals "$(pgrep -fc "sleep 1000$MARKER")" 4
kill -9 $pid
wait $pid 2>/dev/null
check "kill -9 of idist-run: escaped helpers gone too" no_run_leftovers "$(run_id_in "$TMP/out.kill2")"

# --- the env contract each rank gets ----------------------------------------------------
out=$("$RUN" -n 2 -- "$RANKS/print_env.sh" -n 5 --foo 2>&1)
check "ranks get RANK 0 and 1 with WORLD_SIZE 2" \
  equals "$(grep -cE '^RANK=[01] WORLD_SIZE=2 LOCAL_RANK=[01] LOCAL_WORLD_SIZE=2 NODE_RANK=0 GROUP_RANK=0 GROUP_WORLD_SIZE=1 ' <<<"$out")" 2
check "RANK equals LOCAL_RANK on one node" equals "$(grep -cE '^RANK=([01]) WORLD_SIZE=2 LOCAL_RANK=\1 ' <<<"$out")" 2
check "MASTER_ADDR is loopback, MASTER_PORT a port" equals "$(grep -cE 'MASTER_ADDR=127.0.0.1 MASTER_PORT=[1-9][0-9]* ' <<<"$out")" 2
check "launcher, restart count and a 128-bit token" equals "$(grep -c 'IDIST_LAUNCHER=spawn IDIST_RESTART_COUNT=0 TOKEN_LEN=32' <<<"$out")" 2
check "both ranks share one run id" equals "$(grep -o 'RUN_ID=[0-9a-f]*' <<<"$out" | sort -u | wc -l)" 1
check "options after the program are the program's" equals "$(grep -c 'ARGS=-n 5 --foo$' <<<"$out")" 2
check "OMP_NUM_THREADS set when unset" equals "$(grep -cE 'OMP=[1-9]' <<<"$out")" 2
out=$(OMP_NUM_THREADS=7 "$RUN" -n 2 "$RANKS/print_env.sh" 2>&1)
check "OMP_NUM_THREADS the user set is kept" equals "$(grep -c 'OMP=7 ' <<<"$out")" 2
p1=$("$RUN" -n 1 "$RANKS/print_env.sh" | grep -o 'MASTER_PORT=[0-9]*')
p2=$("$RUN" -n 1 "$RANKS/print_env.sh" | grep -o 'MASTER_PORT=[0-9]*')
echo "  two runs got $p1 and $p2"
out=$("$RUN" -n 1 --master-port 23456 --master-addr localhost "$RANKS/print_env.sh" 2>&1)
check "--master-addr and --master-port are passed on" contains "$out" "MASTER_ADDR=localhost MASTER_PORT=23456 "

# --- output: whole lines, nothing lost ---------------------------------------------------
out=$("$RUN" -n 2 --tag-output "$RANKS/chatty.sh" 2>&1)
check "6000 tagged lines arrive" equals "$(wc -l <<<"$out")" 6000
check "no line is mixed between ranks" \
  equals "$(grep -cE '^(\[rank 0\] A{300}|\[rank 1\] B{300})$' <<<"$out")" 6000
out=$("$RUN" -n 2 "$RANKS/chatty.sh" 2>&1)
check "untagged: no line is mixed between ranks" equals "$(grep -cE '^(A{300}|B{300})$' <<<"$out")" 6000

# --- -n auto and --bind ------------------------------------------------------------------
cpus_of_rank() { grep "^RANK=$1 " <<<"$2" | grep -o 'CPUS=[^ ]*' | cut -d= -f2; }
show='echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE CPUS=$(grep Cpus_allowed_list /proc/self/status | cut -f2) OMP=$OMP_NUM_THREADS"'
out=$("$RUN" -n auto sh -c "$show" 2>&1)
if [ -d /proc/driver/nvidia/gpus ]; then
  echo "# -n auto on a machine with NVIDIA GPUs: one rank per GPU ($(grep -o 'WORLD_SIZE=[0-9]*' <<<"$out" | head -1))"
else
  check "-n auto without a GPU: one rank per usable core ($(nproc))" equals "$(grep -c '^RANK=' <<<"$out")" "$(nproc)"
fi
out=$("$RUN" -n 2 --bind sh -c "$show" 2>&1)
if [ "$(nproc)" -ge 2 ]; then
  check "--bind: ranks 0 and 1 on different cores ($(cpus_of_rank 0 "$out") and $(cpus_of_rank 1 "$out"))" \
    test -n "$(cpus_of_rank 0 "$out")" -a "$(cpus_of_rank 0 "$out")" != "$(cpus_of_rank 1 "$out")"
  # The first share gets the odd core: ceil(n/2) and floor(n/2).
  check "--bind: OMP_NUM_THREADS is each share's size" equals \
    "$(grep "^RANK=0 " <<<"$out" | grep -o 'OMP=[0-9]*')/$(grep "^RANK=1 " <<<"$out" | grep -o 'OMP=[0-9]*')" \
    "OMP=$((($(nproc) + 1) / 2))/OMP=$(($(nproc) / 2))"
else
  echo "# SKIP: --bind across cores: this machine gives idist-run one core"
fi
out=$(OMP_NUM_THREADS=7 "$RUN" -n 2 --bind sh -c "$show" 2>&1)
check "--bind keeps an OMP_NUM_THREADS the user set" equals "$(grep -c 'OMP=7$' <<<"$out")" 2
# The default: bound where each rank gets a cpu of its own and nobody bound idist-run. Claims
# of cpus in a directory of this test's own: jobs of tests running beside it leave these alone.
export IDIST_CPU_CLAIMS=$TMP/claims
all=$(grep Cpus_allowed_list /proc/self/status | cut -f2)
if [ "$(nproc)" -ge 2 ] && [ "$(nproc)" -eq "$(getconf _NPROCESSORS_ONLN)" ]; then
  out=$("$RUN" -n 2 sh -c "$show" 2>&1)
  check "default: ranks 0 and 1 bound to different cores ($(cpus_of_rank 0 "$out") and $(cpus_of_rank 1 "$out"))" \
    test -n "$(cpus_of_rank 0 "$out")" -a "$(cpus_of_rank 0 "$out")" != "$(cpus_of_rank 1 "$out")" \
    -a "$(cpus_of_rank 0 "$out")" != "$all"
  out=$("$RUN" --no-bind -n 2 sh -c "$show" 2>&1)
  check "--no-bind: every rank keeps idist-run's whole mask ($all)" equals \
    "$(cpus_of_rank 0 "$out") $(cpus_of_rank 1 "$out")" "$all $all"
  out=$("$RUN" -n $(($(nproc) + 1)) sh -c "$show" 2>&1)
  check "default, more ranks than cores: not bound" equals "$(cpus_of_rank 0 "$out")" "$all"
  out=$(taskset -c 0 "$RUN" -v -n 1 sh -c "$show" 2>&1)
  check "default under taskset -c 0: the rank keeps the user's mask (0), not bound" equals "$(cpus_of_rank 0 "$out")" 0
  check "... -v says why" contains "$out" "not bound: idist-run's affinity mask (0) is narrower"
  # Two jobs at once: the second finds every cpu bound by the first and runs unbound; the first
  # then unbinds its running ranks, so that the scheduler places both (as with --no-bind).
  "$RUN" -v -n 2 sh -c "sleep 3; $show" >"$TMP/first.out" 2>&1 &
  first=$!
  # Until the first job holds its first cpu (an flock the kernel shows to flock -n), 10 s at most.
  first_cpu=$(cut -d, -f1 <<<"$all" | cut -d- -f1)
  for _ in $(seq 100); do
    [ -e "$IDIST_CPU_CLAIMS/cpu$first_cpu" ] && ! flock -n -s "$IDIST_CPU_CLAIMS/cpu$first_cpu" true && break
    sleep 0.1
  done
  out=$("$RUN" -v -n 2 sh -c "$show; sleep 1" 2>&1)
  check "two jobs: the second is not bound (the first holds the cpus)" equals "$(cpus_of_rank 0 "$out") $(cpus_of_rank 1 "$out")" "$all $all"
  check "... -v says why" contains "$out" "other idist-run jobs here bound ranks to cpu(s)"
  wait $first
  out=$(cat "$TMP/first.out")
  check "two jobs: the first's ranks, bound at the start, end unbound ($(cpus_of_rank 0 "$out") and $(cpus_of_rank 1 "$out"))" \
    equals "$(cpus_of_rank 0 "$out") $(cpus_of_rank 1 "$out")" "$all $all"
  check "... -v says so" contains "$out" "another idist-run job here runs unbound for want of free cpus: ours unbound too"
else
  echo "# SKIP: the default binding: one core, or this shell's mask is already narrower than the machine"
fi
out=$(taskset -c 0 "$RUN" -n 2 --bind sh -c "$show" 2>&1)
check "--bind shares only the cores idist-run may use (taskset -c 0: both on 0)" \
  equals "$(cpus_of_rank 0 "$out")/$(cpus_of_rank 1 "$out")" "0/0"
out=$("$RUN" -n 2 --no-bind sh -c "$show" 2>&1)
check "with --no-bind, ranks keep every core ($(cpus_of_rank 0 "$out"))" \
  equals "$(cpus_of_rank 0 "$out")" "$(grep Cpus_allowed_list /proc/self/status | cut -f2)"

finish
