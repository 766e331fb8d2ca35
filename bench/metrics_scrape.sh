#!/bin/bash
# How long a scrape of idist-run --metrics takes for a job of N ranks (issue 47: 256 ranks in
# under 100 ms): N ranks of `sleep` (each with its recorder's memory, read like any rank's, and
# its /proc), scraped ROUNDS times with curl.
#   usage: bench/metrics_scrape.sh [BUILD_DIR (default build)] [N (default 256)] [ROUNDS (default 5)]
set -euo pipefail
BUILD=$(realpath "${1:-build}")
N=${2:-256}
ROUNDS=${3:-5}
RUN=$BUILD/apps/idist-run/idist-run
[ -x "$RUN" ] || { echo "metrics_scrape.sh: error: $RUN not built (cmake --build $BUILD)" >&2; exit 2; }
port=$((61000 + RANDOM % 4000))
"$RUN" -n "$N" --metrics "127.0.0.1:$port" sleep 60 >/dev/null 2>&1 &
job=$!
trap 'kill $job 2>/dev/null' EXIT
for _ in $(seq 200); do
  [ "$(curl -s "http://127.0.0.1:$port/metrics" | grep -c '^idist_rank_state')" = "$N" ] && break
  sleep 0.1
done
printf '%s ranks, scrape seconds:' "$N"
for _ in $(seq "$ROUNDS"); do printf ' %s' "$(curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$port/metrics")"; done
echo " (target: under 0.1)"
