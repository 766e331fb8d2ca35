#!/bin/bash
# Who gets the blame: N jobs of 3 ranks doing tiny gloo all_reduces, where the test kill -9s one
# rank in the middle of them. The survivors fail moments later (SIGPIPE, an error exit, an
# abort), at times before the dead rank is reaped; the summary must still name the killed rank.
# Prints "blamed the killed rank in X/N" and requires X == N.
# usage: churn.sh IDIST_RUN CHURN_RANK [N]
source "$(dirname "$0")/lib.sh"
RUN=$1
PROG=$2
N=${3:-50}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
command -v jq >/dev/null || { echo "jq is missing"; exit 77; }

blamed=0
reblamed=0
run_ids=()
start=$(now_ms)
for i in $(seq "$N"); do
  victim=$((i % 3))
  dir="$TMP/job$i"
  mkdir -p "$dir/logs"
  "$RUN" -v -n 3 --log-dir "$dir/logs" "$PROG" >"$dir/out" 2>"$dir/err" &
  pid=$!
  if ! wait_for_lines "$dir/out" " ready" 3; then
    echo "  job $i: the ranks did not start: $(tr '\n' ' ' <"$dir/err")"
    kill -TERM $pid
    wait $pid
    continue
  fi
  victim_pid=$(grep "^rank $victim pid " "$dir/out" | cut -d' ' -f4)
  sleep "0.0$((RANDOM % 10))"  # somewhere in the middle of the all_reduces
  kill -9 "$victim_pid"
  wait $pid
  rc=$?
  json=$(echo "$dir"/logs/*/summary.json)
  run_ids+=("$(jq -r .run_id "$json")")
  first=$(jq '.attempts[0].first_failure' "$json")
  # The line the user reads, and summary.json, both naming the killed rank; exit 128+SIGKILL.
  line=$(grep -F "idist-run: rank $victim (pid $victim_pid on " "$dir/err" | grep -E '\) was killed by SIGKILL(;|$)')
  if [ "$first" = "$victim" ] && [ "$rc" = 137 ] && [ -n "$line" ]; then
    blamed=$((blamed + 1))
    grep -q "the cause of rank .*'s failure, not a consequence of it" "$dir/err" && reblamed=$((reblamed + 1))
  else
    echo "  job $i: killed rank $victim; exit $rc, blamed rank $first; [rank, exit code, signal, end]:" \
      "$(jq -c '[.attempts[0].ranks[] | [.rank, .exit_code, .signal, .end[17:]]]' "$json")"
  fi
done
elapsed=$(($(now_ms) - start))
echo "  blamed the killed rank in $blamed/$N (exit 137, the summary line and summary.json; $((elapsed / 1000)) s);" \
  "in $reblamed of them a survivor's failure was seen first"
check "the killed rank is blamed in every job ($blamed/$N)" equals "$blamed" "$N"
# One pass over /proc for every run's IDIST_RUN_ID (lib.sh's no_run_leftovers is one run's).
leftovers() {
  local f
  for f in /proc/[0-9]*/environ; do
    grep -qszxF -f <(printf 'IDIST_RUN_ID=%s\n' "${run_ids[@]}") "$f" && echo "${f//[^0-9]/}"
  done
}
check "no process of any run left" test -z "$(sleep 0.5; leftovers)"
finish
