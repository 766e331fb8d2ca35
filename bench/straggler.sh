#!/bin/bash
# Straggler reports' targets (issue 47), on a quiet machine: a 4-rank job (tests/e2e/
# metrics_rank: steps of 100 ms of the ranks' own work, 10 spinning and 90 asleep) whose rank 2
# takes 10% (then 20%) longer from step 20: how many steps later idist-run names it, each of
# ROUNDS runs; then a healthy job of MINUTES minutes at the default threshold (10%): how many
# straggler lines (the target: none).
#   usage: bench/straggler.sh [BUILD_DIR (default build)] [ROUNDS (default 5)] [MINUTES (default 5)]
set -euo pipefail
BUILD=$(realpath "${1:-build}")
ROUNDS=${2:-5}
MINUTES=${3:-5}
RUN=$BUILD/apps/idist-run/idist-run
PROG=$BUILD/tests/e2e/metrics_rank
for f in "$RUN" "$PROG"; do
  [ -x "$f" ] || { echo "straggler.sh: error: $f not built (cmake --build $BUILD)" >&2; exit 2; }
done
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
export OMP_NUM_THREADS=1 METRICS_RANK_SLEEP_MS=90 METRICS_RANK_PROGRESS=1
echo "slower  target      steps from the slowdown to the line, each round"
for pct in 10 20; do
  target=$([ $pct = 10 ] && echo 10 || echo 5)
  row=""
  for _ in $(seq "$ROUNDS"); do
    "$RUN" -n 4 "$PROG" 60 10 2 $pct 20 >"$DIR/out" 2>&1
    at=$(awk '/^step /{s=$2} /straggler: rank 2/{print s - 20; exit}' "$DIR/out")
    row+=" ${at:-never}"
  done
  printf '%5s%%  within %2d %s\n' "$pct" "$target" "$row"
done
[ "$MINUTES" -gt 0 ] || exit 0
steps=$((MINUTES * 600))
"$RUN" -n 4 "$PROG" "$steps" 10 >"$DIR/healthy" 2>&1
echo "healthy, $MINUTES min ($steps steps of 100 ms): $(grep -c "straggler:" "$DIR/healthy" || true) straggler lines (target 0)"
grep "straggler:" "$DIR/healthy" | head -3 || true
