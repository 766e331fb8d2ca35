#!/bin/bash
# Large all_reduces on 2 ranks over shared memory (shm_large_check.cpp), where the work is split
# and goes in rounds, each started by a step of its own (shm_backend.cpp, kSplitTwoFrom):
#   - every dtype and op, counts from the split's start to several rounds, NaNs included, every
#     element right; back-to-back calls whose values change every call;
#   - a peer killed in the middle of 64 MiB calls: the survivor raises, naming it, in seconds.
# Usage: shm_large.sh IDIST_RUN SHM_LARGE_CHECK
set -u
run=$1
prog=$2
source "$(dirname "$0")/lib.sh"
export IDIST_TIMEOUT=60 IDIST_INTRANODE=shm
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$run" -n 2 "$prog" >"$scratch/out" 2>&1
rc=$?
grep "checks," "$scratch/out"
check "2 ranks, large all_reduces over shared memory: exit 0, every check passed on both ranks" \
  eval '[ $rc = 0 ] && [ "$(grep -c "checks, 0 failed" "$scratch/out")" = 2 ]' || grep -E "FAILED|error" "$scratch/out" | head -5

# Ranks started by hand: no idist-run to stop the survivor before it says what it saw.
port=$(random_port)
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 60 "$prog" --forever >"$scratch/die.$r" 2>&1 &
  pids+=($!)
done
for _ in $(seq 300); do
  grep -q calling "$scratch/die.0" && grep -q calling "$scratch/die.1" && break
  sleep 0.1
done
victim=$(pgrep -P "${pids[1]}")
check "both ranks in their 64 MiB calls, rank 1's process found" eval \
  'grep -q calling "$scratch/die.1" && [ -n "$victim" ]' || cat "$scratch"/die.*
start=$(now_ms)
kill -9 ${victim:-${pids[1]}}
wait_codes "${pids[0]}"
elapsed=$(($(now_ms) - start))
wait "${pids[1]}" 2>/dev/null
check "a peer killed mid-call: the survivor raises (exit 3) within 5 s ($elapsed ms)" \
  eval '[ "${codes[0]}" = 3 ] && [ "$elapsed" -lt 5000 ]' || cat "$scratch/die.0"
check "... naming the lost rank and the call" \
  grep -q "connection to rank 1 lost: it exited while this rank waited for it in all_reduce (shared memory)" \
  "$scratch/die.0" || cat "$scratch/die.0"
finish
