#!/bin/bash
# auto_model where the ranks differ (uneven_check.cpp): models that differ are refused at wrap
# on every rank, naming the first difference; a rank out of data that calls finalize() ends the
# job in seconds with every rank non-zero and the words; idist::join trains to PyTorch's DDP
# join's parameters (ddp_join.py). Over shared memory, TCP and the mpi backend, at 2 and 3 ranks.
# usage: uneven.sh IDIST_RUN UNEVEN_CHECK
source "$(dirname "$0")/../e2e/lib.sh"
RUN=$(realpath "$1")
CHECK=$(realpath "$2")
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# refused LABEL N OUTPUT WORDS: every rank failed at wrap within 2 s, and said WORDS.
refused() {
  local label=$1 n=$2 out=$3 words=$4
  check "$label: all $n ranks refuse" equals "$(grep -c "error .* after wrap: .*auto_model.*: the replicas differ: " <<<"$out")" "$n" ||
    sed 's/^/  | /' <<<"$out" | head -8
  check "$label: the words: $words" equals "$(count "$out" "$words")" "$n"
  check "$label: each refusal within 2 s of the wrap" none_after 2 "$out"
}

# since START: seconds from START (date +%s.%N) to now (awk: bc is not on a fresh Debian).
since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.3f", a - b }'; }

# none_after S OUTPUT: no rank's line says it failed S s or more after the wrap.
none_after() {
  ! grep -oE "error [0-9]+\.[0-9]+ s after wrap" <<<"$2" | awk -v s="$1" '$2 >= s { found = 1 } END { exit !found }'
}

# says OUTPUT RANK WORDS...: RANK's line holds every one of WORDS (fixed strings).
says() {
  local line w
  line=$(grep "^rank $2: error" <<<"$1")
  shift 2
  for w in "$@"; do grep -qF -- "$w" <<<"$line" || return 1; done
}

# a_waiter_says OUTPUT N WORDS...: one of ranks 0..N-2 (those left waiting) says WORDS. Not rank
# 0 alone: the first waiter to raise ends the job, and idist-run may stop the others before they
# print (a CI run with 3 ranks on a loaded machine: rank 1 raised, rank 0 was stopped).
a_waiter_says() {
  local out=$1 n=$2 r
  shift 2
  for ((r = 0; r < n - 1; r++)); do says "$out" $r "$@" && return 0; done
  return 1
}

# waiters_stopped OUTPUT N: idist-run stopped every waiter before it could raise (the leaver's
# exit comes first, and a waiter learns of it only then: seen with 2 ranks over shared memory).
waiters_stopped() {
  grep -q "stopped rank(s)" <<<"$1" && ! grep -E "^rank [0-9]+: error" <<<"$1" | grep -qv "^rank $(($2 - 1)):"
}

# The cases, run by LAUNCH (a command prefix) with the mpi backend's flags in EXTRA.
cases() {
  local transport=$1 n=$2
  shift 2
  local start out rc elapsed
  start=$(date +%s.%N)
  out=$("$@" "$CHECK" transposed $EXTRA 2>&1)
  # What starting and ending a job costs with this launcher: mpirun alone takes seconds.
  local baseline
  baseline=$(since "$start")
  refused "$transport, $n ranks, a transposed layer" $n "$out" "parameter 'fc1.weight' is [16, 12] on rank 0 and [12, 16] on rank 1"
  out=$("$@" "$CHECK" buffers $EXTRA 2>&1)
  refused "$transport, $n ranks, a buffer on one rank" $n "$out" "rank 0 has 0 buffers and rank $((n - 1)) has 1: 'running' [2] is on rank $((n - 1)) only"
  # The other differences travel as these two do (an all_reduce of a hash, then an all_gather of
  # each rank's description, compared alike on every rank): over shared memory only.
  if [ "$transport" = "shared memory" ]; then
    out=$("$@" "$CHECK" hidden $EXTRA 2>&1)
    refused "$transport, $n ranks, another hidden size" $n "$out" "parameter 'fc1.weight' is [50, 12] on rank 0 and [60, 12] on rank 1"
    out=$("$@" "$CHECK" extra $EXTRA 2>&1)
    refused "$transport, $n ranks, one more layer" $n "$out" "rank 0 has 4 parameters and rank $((n - 1)) has 6: 'fc3.weight' [3, 3] is on rank $((n - 1)) only"
    out=$("$@" "$CHECK" dtype $EXTRA 2>&1)
    refused "$transport, $n ranks, float64 on one rank" $n "$out" "parameter 'fc1.weight' is Float on rank 0 and Double on rank $((n - 1))"
  fi

  start=$(date +%s.%N)
  out=$(timeout 60 "$@" "$CHECK" uneven $EXTRA 2>&1)
  rc=$?
  elapsed=$(since "$start")
  echo "# $transport, $n ranks, uneven data without join: exit $rc after ${elapsed}s (a job refused at wrap: ${baseline}s)"
  check "$transport, $n ranks, uneven data: the job fails" test "$rc" -ne 0
  if [ "$transport" != mpi ]; then
    # Unless the machine is so loaded that a job refused at wrap already takes longer (10 s
    # was seen in a CI run with other tests beside it): then no longer than that job and 1 s.
    check "$transport, $n ranks, uneven data: the job ends within 5 s (or the refused job's ${baseline}s + 1 s)" \
      awk -v e="$elapsed" -v b="$baseline" 'BEGIN { exit !(e < 5 || e < b + 1) }'
  fi
  # Against the wall clock, a wait of IDIST_TIMEOUT's order (300 s) is what this catches; the
  # 5 s leave room for mpirun's start and stop on a loaded machine (3.03 s over the baseline
  # was seen in CI with a build beside it). The precise bound is in-program: "within 2 s of
  # the wrap", below.
  check "$transport, $n ranks, uneven data: ... at most 5 s longer than a job refused at wrap" \
    awk -v e="$elapsed" -v b="$baseline" 'BEGIN { exit !(e - b < 5) }'
  check "$transport, $n ranks, uneven data: no rank ends ok" equals "$(count "$out" ": ok")" 0 || sed 's/^/  | /' <<<"$out" | head -8
  # The last rank has the fewest batches (6 of 2 ranks, 5 of 3) and leaves first.
  local steps=$((8 - n))
  if waiters_stopped "$out" $n; then
    # Then the leaver's line is what the user reads: it names the rank it left waiting.
    check "$transport, $n ranks, uneven data: every waiter was stopped before it raised; the leaver names one waiting" \
      eval 'grep "^rank $((n - 1)): error" <<<"$out" | grep -qE "rank [0-$((n - 2))] was left waiting for this rank in "' ||
      sed 's/^/  | /' <<<"$out" | head -8
  else
    check "$transport, $n ranks, uneven data: a rank left waiting names the rank that left and its steps" \
      a_waiter_says "$out" $n "rank $((n - 1)) called finalize() after $steps steps while this rank waits for it" ||
      sed 's/^/  | /' <<<"$out" | head -8
    check "$transport, $n ranks, uneven data: ... in auto_model's bucket, pointing at idist::join" \
      a_waiter_says "$out" $n "auto_model bucket 0 (" "uneven data? see idist::join"
  fi
  # The issue's bound for the job (under 5 s), in-program: a loaded CI machine (3 mpi ranks on
  # 2 cores beside a package build) has taken over 2 s.
  check "$transport, $n ranks, uneven data: every rank fails within 5 s of the wrap" none_after 5 "$out"
  check "$transport, $n ranks, uneven data: the rank that left first raises in finalize() too" \
    says "$out" $((n - 1)) "finalize(" "): rank " " was left waiting for this rank in " \
    "which this rank never called: it called finalize() after $steps steps" || sed 's/^/  | /' <<<"$out" | head -8
}

# join: idist::join's parameters against DDP's join's, at 1e-5.
joined() {
  local transport=$1 n=$2 flag=$3
  shift 3
  local label="$transport, $n ranks, idist::join${flag:+ (divide_by_initial_world_size=false)}"
  local mine=$TMP/mine.$n$flag ref=$TMP/ref.$n$flag
  local out
  out=$("$@" "$CHECK" "join${flag:+_world}" --out "$mine" $EXTRA 2>&1)
  check "$label: every rank trains and ends ok" equals "$(count "$out" ": ok")" "$n" || sed 's/^/  | /' <<<"$out" | head -8
  check "$label: every rank ends with the same parameters" equals "$(grep 'parameters sum' <<<"$out" | awk '{print $NF}' | sort -u | wc -l)" 1
  if [ ! -s "$ref" ]; then
    OMP_NUM_THREADS=1 timeout 120 "$RUN" -n "$n" "$PY" "$HERE/ddp_join.py" "$ref" $flag >"$TMP/ref.log" 2>&1 || { sed 's/^/  | /' "$TMP/ref.log" | tail -5; }
  fi
  check "$label: parameters equal to PyTorch DDP's model.join() at 1e-5" python3 - "$mine" "$ref" <<'EOF'
import sys
a = [l.split() for l in open(sys.argv[1])]
b = [l.split() for l in open(sys.argv[2])]
assert len(a) == len(b) > 0, (len(a), len(b))
worst = max(abs(float(x[1]) - float(y[1])) for x, y in zip(a, b))
assert all(x[0] == y[0] for x, y in zip(a, b)), "names differ"
print(f"  # {len(a)} parameters, the largest difference {worst:.2e}")
assert worst <= 1e-5, worst
EOF
}

export IDIST_TIMEOUT=300  # the default: nothing here may wait for it
PY=/usr/bin/python3  # Debian's, with python3-torch
python_torch=1
"$PY" -c "import torch.distributed" 2>/dev/null || python_torch=0
EXTRA=
for n in 2 3; do
  cases "shared memory" $n "$RUN" -n $n
  cases "TCP" $n env IDIST_INTRANODE=off "$RUN" -n $n
  if [ $python_torch = 1 ]; then
    joined "shared memory" $n "" "$RUN" -n $n
    joined "TCP" $n "" env IDIST_INTRANODE=off "$RUN" -n $n
    joined "shared memory" $n --world "$RUN" -n $n
  else
    echo "SKIPPED: the comparisons with PyTorch's DDP join (no python3-torch)"
  fi
done

if command -v mpirun >/dev/null && ! IDIST_NO_DETECT=1 "$CHECK" x --backend mpi 2>&1 | grep -q "is not built"; then
  EXTRA="--backend mpi"
  for n in 2 3; do
    cases mpi $n mpirun --allow-run-as-root --oversubscribe --bind-to none -np $n
    [ $python_torch = 1 ] && joined mpi $n "" mpirun --allow-run-as-root --oversubscribe --bind-to none -np $n
  done
else
  echo "SKIPPED: the mpi runs (no mpirun, or no mpi backend in this build)"
fi
finish
