#!/bin/bash
# Issue 46's 20-failure run as a test: bench/ddp/recovery_churn.sh (4 ranks of recover_check's MLP
# under idist::Recovery, idist-run --max-restarts 20) with 20 failures injected at random times
# and ranks, kill -9 and SIGSTOP mixed, each lost rank replaced (a replacement lost while it
# starts too). The run finishes with exit 0 in one attempt, at most one step redone per
# failure, every sample once, and the parameters as close to a run without failures as runs on
# 3, 2 or 1 processes are to 4 ranks (the world size alone).
# usage: churn.sh IDIST_RUN RECOVER_CHECK
source "$(dirname "$0")/../e2e/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=20
steps=1000
# A failure every 1.9-3.1 s (the benchmark's 1.5-2.5 s: with other tests loading the cores, a
# replacement took longer to start than the next loss took to come, until every member of the
# job was lost and it restarted from its checkpoint) over a run paced at 40 ms a step; a
# frozen rank named after 2 s without a beat (the benchmark's 1 s starves on 2 busy cores); no
# dropout, so that the runs differ only by the order of their reductions (each world size draws
# its own dropout masks, which makes any two runs 0.1-0.3 apart: no test of anything).
out=$(IDIST_RUN=$(realpath "$1") RECOVER_CHECK=$(realpath "$2") CHURN_PLOT=0 CHURN_HEARTBEAT=2 CHURN_GAP=2.5 CHURN_PAUSE_MS=40 CHURN_DROPOUT=0 \
  bash "$ROOT/bench/ddp/recovery_churn.sh" $failures $steps "$TMP" 2>&1)
echo "$out" | sed 's/^/  | /'
line=$(grep "^# churn: " <<<"$out" | tail -1)
value() { grep -o " $1=[^ ]*" <<<"$line" | cut -d= -f2; }
check "$failures failures injected (got $(value injected))" equals "$(value injected)" $failures ||
  tail -20 "$TMP/churn.out" | sed 's/^/  | /'
check "the job ends with exit 0 (got $(value exit))" equals "$(value exit)" 0 || tail -20 "$TMP/churn.out" | sed 's/^/  | /'
check "... in one attempt: idist-run says it succeeded after its re-forms" \
  eval 'grep -q "succeeded after [0-9]* re-forms (" "$TMP/churn.out" && ! grep -q "succeeded on attempt" "$TMP/churn.out"' ||
  grep -E "^idist-run: .*(live recovery|attempt|frozen|before it joined)" "$TMP/churn.out" | head -30 | cut -c1-300 | sed 's/^/  | /'
check "every step done ($(value steps) of $steps)" equals "$(value steps)" $steps
check "at most one step redone per failure ($(value redone) for $failures)" \
  eval '[ -n "$(value redone)" ] && [ "$(value redone)" -le $failures ]'
check "every sample once ($(value seen) of $(value samples))" \
  eval '[ -n "$(value seen)" ] && [ "$(value seen)" = "$(value samples)" ]'
check "a lost rank replaced at least $((failures / 2)) times (got $(value replaced))" \
  eval '[ -n "$(value replaced)" ] && [ "$(value replaced)" -ge $((failures / 2)) ]'
# The world-size tolerance: how far a run on 3, 2 or 1 processes is from 4 ranks, the largest
# (about 1e-4 after 1,000 steps; with OpenBLAS it is 3 ranks' 1.2e-4, with the reference BLAS 1
# process's 1e-4). Twice it: a run through worlds of 2 to 4 ranks lands about as far (3.5e-5
# seen); one step more or less moves the sum by 0.02, 80 times as far.
check "parameters within twice the world-size tolerance of a run without failures ($(value diff) <= 2 x $(value tolerance))" \
  awk -v d="$(value diff)" -v t="$(value tolerance)" 'BEGIN { exit !(d != "" && t != "" && d + 0 <= 2 * t) }'
finish
