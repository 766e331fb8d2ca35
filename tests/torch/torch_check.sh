#!/bin/bash
# idist::torch on real ranks: torch_check (tensor collectives, auto_model against one process
# with the whole batch, no_sync, unused parameters, BatchNorm, mixed dtypes, overlap,
# auto_dataloader, bad inputs) over shared memory (idist-run's default on one host), over TCP
# (IDIST_INTRANODE=off) and with the mpi backend under a real mpirun, at 2 and 3 ranks, and in
# a world of one. The two-host hierarchical run is in tests/e2e/hierarchical_netns.sh.
# usage: torch_check.sh IDIST_RUN TORCH_CHECK
source "$(dirname "$0")/../e2e/lib.sh"
RUN=$(realpath "$1")
CHECK=$(realpath "$2")
export IDIST_TIMEOUT=60

# passes LABEL N OUTPUT: every one of the N ranks reported no failure.
passes() {
  local label=$1 n=$2 out=$3
  check "$label: $n ranks, no failure" equals "$(count "$out" "checks, 0 failed")" "$n" ||
    grep -E "FAIL|rror" <<<"$out" | head -10 | sed 's/^/  | /'
}

passes "a world of one (no launcher)" 1 "$("$CHECK" 2>&1)"
for n in 2 3; do
  passes "shared memory" $n "$("$RUN" -n $n "$CHECK" 2>&1)"
  passes "gloo over TCP" $n "$(IDIST_INTRANODE=off "$RUN" -n $n "$CHECK" 2>&1)"
done
out=$("$RUN" -n 2 "$CHECK" ddp 2>&1)
check "overlap shows: the first bucket started before backward ended" contains "$out" "ok   overlap"
grep "buckets started at" <<<"$out" | head -2

if command -v mpirun >/dev/null && ! IDIST_NO_DETECT=1 "$CHECK" --backend mpi loader 2>&1 | grep -q "is not built"; then
  for n in 2 3; do
    passes "mpi under mpirun" $n "$(mpirun --allow-run-as-root --oversubscribe --bind-to none -np $n "$CHECK" --backend mpi 2>&1)"
  done
else
  echo "SKIPPED: the mpi runs (no mpirun, or no mpi backend in this build)"
fi
finish
