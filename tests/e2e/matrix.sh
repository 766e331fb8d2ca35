#!/bin/bash
# The collective matrix (matrix.cpp) on one backend at world sizes 1 to 4, then the failure
# cases: a rank that dies mid-collective, and ranks that disagree under IDIST_DEBUG=1.
#   gloo: ranks started by idist-run (and, for the dying rank, by hand, so that nothing but
#         the library's own error stops the survivors).
#   shm:  the gloo backend carried by shared memory (IDIST_INTRANODE=shm), as idist-run on one
#         host runs it by default; "gloo" here is gloo over TCP (IDIST_INTRANODE=off).
#   mpi:  ranks started by a real mpirun, directly and through idist-run.
# Usage: matrix.sh gloo|shm|mpi IDIST_RUN MATRIX. Exits 77 (skipped) when the backend is not built.
set -u
label=$1
backend=$1
run=$2
matrix=$3
source "$(dirname "$0")/lib.sh"
case $label in
  gloo) export IDIST_INTRANODE=off ;;
  shm) export IDIST_INTRANODE=shm; backend=gloo ;;
esac
export IDIST_TIMEOUT=60
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

if [ "$backend" = mpi ]; then
  if ! command -v mpirun >/dev/null; then
    echo "SKIPPED: no mpirun on this machine (apt-get install openmpi-bin)"
    exit 77
  fi
  probe=$(IDIST_NO_DETECT=1 "$matrix" --backend mpi --mismatch 2>&1)
  if contains "$probe" "is not built into this libidist"; then
    echo "SKIPPED: the mpi backend is not built (configure with -DIDIST_WITH_MPI=ON; needs libopenmpi-dev)"
    exit 77
  fi
fi

# by_hand NAME MATRIX_ARGS...: 3 ranks started by hand (no idist-run to stop the survivors),
# on a port below both idist's derived range and the kernel's ephemeral one. Sets `codes`
# (their exit codes, by rank) and `out` (their output, rank by rank).
by_hand() {
  local name=$1 port=$((10000 + RANDOM % 10000)) r
  shift
  local pids=()
  for r in 0 1 2; do
    RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$matrix" "$@" >"$scratch/$name.$r" 2>&1 &
    pids+=($!)
  done
  wait_codes "${pids[@]}"
  out=$(cat "$scratch/$name".*)
}

# matrix_on N: runs the matrix on N ranks, with all their output.
matrix_on() {
  local n=$1
  if [ "$backend" = mpi ]; then
    "${mpirun_cmd[@]}" -np "$n" "$matrix" --backend mpi 2>&1
  else
    "$run" -n "$n" "$matrix" --backend "$backend" 2>&1
  fi
}

for n in 1 2 3 4; do
  start=$(now_ms)
  out=$(matrix_on "$n")
  rc=$?
  echo "$out" | grep -E "^matrix rank|FAILED" | head -n 12
  echo "  world size $n: $(($(now_ms) - start)) ms"
  check "$label matrix, world size $n: exit 0" equals "$rc" 0
  check "$label matrix, world size $n: every rank reports no failure" \
    equals "$(count "$out" "checks, 0 failed")" "$n"
  [ "$label" = shm ] && [ "$n" -gt 1 ] && check "shm matrix, world size $n: shared memory carries gloo on every rank" \
    equals "$(count "$out" "backend: gloo (shared memory: every rank on this host)")" "$n"
  [ "$label" = gloo ] && check "gloo matrix, world size $n: gloo over TCP, no shared memory (IDIST_INTRANODE=off)" \
    equals "$(count "$out" "shared memory")" 0
done

if [ "$backend" = mpi ]; then
  # Through idist-run: it detects mpirun and execs the program in place on every rank.
  out=$("${mpirun_cmd[@]}" -np 3 "$run" --backend mpi "$matrix" --backend mpi --quick 2>&1)
  check "mpi matrix through idist-run under mpirun: exit 0" equals "$?" 0
  check "mpi matrix through idist-run: 3 ranks report no failure" equals "$(count "$out" "checks, 0 failed")" 3
  # Without mpirun the ranks are not one MPI world: a clear error, not a hang.
  out=$(timeout 60 "$run" -n 2 --backend mpi "$matrix" --backend mpi 2>&1)
  rc=$?
  echo "$out" | head -n 3
  check "idist-run -n 2 --backend mpi without mpirun fails" test "$rc" -ne 0 -a "$rc" -ne 124
  check "... saying the ranks need mpirun" contains "$out" "mpirun"
fi

# A rank that dies mid-collective: the survivors raise within the timeout.
export IDIST_TIMEOUT=20
start=$(now_ms)
if [ "$backend" = mpi ]; then
  out=$(timeout 60 "${mpirun_cmd[@]}" -np 3 "$matrix" --backend mpi --die 2>&1)
  rc=$?
  echo "$out" | grep -v "^\s*$" | head -n 6
  check "mpi: a dead rank ends the job (mpirun exits non-zero, no hang)" test "$rc" -ne 0 -a "$rc" -ne 124
else
  by_hand die --backend "$backend" --die
  echo "$out"
  check "$label: the dead rank exited 9" equals "${codes[1]}" 9
  check "$label: rank 0 raised (exit 3)" equals "${codes[0]}" 3
  check "$label: rank 2 raised (exit 3)" equals "${codes[2]}" 3
  check "$label: the error names the op and backend" contains "$out" "all_reduce($backend)"
  [ "$label" = shm ] && check "shm: both survivors name the dead rank" equals \
    "$(count "$out" "connection to rank 1 lost: it exited while this rank waited for it in all_reduce (shared memory)")" 2
fi
elapsed=$(($(now_ms) - start))
echo "  survivors done after $elapsed ms"
check "$label: well within the 20 s timeout" test "$elapsed" -lt 20000

# A late rank (gloo: the store can tell who did not come): a monitored_barrier and an
# all_reduce time out, and the ranks that came name the one that did not.
if [ "$backend" = gloo ]; then
  IDIST_TIMEOUT=2 by_hand hang --hang
  echo "$out" | grep -v "named the late"
  check "monitored_barrier names the late rank, on all 3 ranks alike" equals \
    "$(count "$out" "monitored_barrier(gloo): rank 2 did not arrive within 1s")" 3
  check "a timed-out all_reduce names the rank that did not arrive, on ranks 0 and 1" equals \
    "$(count "$out" "; rank 2 did not arrive at it")" 2
  check "ranks 0 and 1 named it both times (exit 0)" equals "${codes[0]}${codes[1]}" 00
fi

# A rank that leaves (finalize()) while the others wait for it in a monitored_barrier of 30 s:
# they raise at once, naming what it did, and its finalize() raises, as it left them waiting.
if [ "$backend" = gloo ]; then
  start=$(now_ms)
  by_hand leave --leave
  echo "$out" | grep -v "backend:"
  echo "  ended after $(($(now_ms) - start)) ms"
  check "$label: ranks 0 and 1 raised within 5 s, naming the rank that left and what it did" equals \
    "${codes[0]}${codes[1]}" 00
  check "$label: the leaver's finalize() raised (exit 1)" equals "${codes[2]}" 1
  check "... saying whom it left waiting, and where" contains "$out" \
    "rank 0 was left waiting for this rank in monitored_barrier #0, which this rank never called"
fi

# IDIST_DEBUG=1: ranks that call different collectives all raise, naming the rank that differs.
if [ "$backend" = mpi ]; then
  out=$(IDIST_DEBUG=1 timeout 120 "${mpirun_cmd[@]}" -x IDIST_DEBUG -np 3 "$matrix" --backend mpi --mismatch 2>&1)
else
  out=$(IDIST_DEBUG=1 timeout 120 "$run" -n 3 "$matrix" --backend "$backend" --mismatch 2>&1)
fi
rc=$?
echo "$out" | head -n 3
check "IDIST_DEBUG: exit 0 (every rank raised both times and the group stayed usable)" equals "$rc" 0
check "IDIST_DEBUG: a count mismatch is named on all 3 ranks" equals \
  "$(count "$out" "rank 1 calls all_reduce(float32, count 5, SUM) but rank 0 calls all_reduce(float32, count 4, SUM)")" 3
check "IDIST_DEBUG: a different op is named on all 3 ranks" equals \
  "$(count "$out" "rank 1 calls broadcast(int32, count 4, root 0) but rank 0 calls all_reduce(int32, count 4, MAX)")" 3

# Without IDIST_DEBUG, sizes that differ over TCP end in Gloo's enforce on its I/O thread, which
# nothing can catch: the process still aborts, but says so in idist's words, naming the call
# and both sizes, with none of Gloo's raw text.
if [ "$label" = gloo ]; then
  out=$(timeout 60 "$run" -n 2 "$matrix" --sizes 2>&1)
  rc=$?
  check "gloo over TCP, sizes that differ without IDIST_DEBUG: the job fails" test "$rc" -ne 0
  named() { grep -qE "all_reduce\(gloo\): a peer sent [0-9]+ bytes where this rank's call holds [0-9]+: the ranks called all_reduce with different sizes" <<<"$out"; }
  no_raw() { ! grep -qE 'EnforceNotMet|enforce fail|preamble' <<<"$out"; }
  check "... in idist's words, naming the call and both sizes" named || sed 's/^/  | /' <<<"$out" | head -8
  check "... and no raw Gloo text" no_raw
fi

# Shared memory has no name in any file system: nothing of idist's is in /dev/shm, whatever
# died (other programs' files, Open MPI's for one, may come and go meanwhile).
check "$label: nothing of idist's in /dev/shm" equals "$(ls /dev/shm | grep -c idist)" 0

finish
