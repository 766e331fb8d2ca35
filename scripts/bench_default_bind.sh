#!/bin/bash
# What a user gets by default on one host (issue 29): 8 B all_reduce on 2 ranks, three ways, in
# one run, the order rotated every round so that each sees the machine's load alike:
#   default   idist-run -n 2 idist-bench               (bound where the ranks fit: the default)
#   no-bind   idist-run --no-bind -n 2 idist-bench     (the default before binding)
#   mpirun    mpirun --allow-run-as-root -np 2 raw_mpi (Open MPI's default, which binds 2 ranks)
# then 64 MiB all_reduce the same three ways. Prints one line per run and a
# summary; nothing is installed or built here.
# usage: bench_default_bind.sh BUILD_DIR [ROUNDS (10)] [LARGE_ROUNDS (4)]
set -euo pipefail
B=$(realpath "$1")
ROUNDS=${2:-10}
LARGE=${3:-4}
RUN=$B/apps/idist-run/idist-run
BENCH=$B/apps/idist-bench/idist-bench
RAW_MPI=$B/bench/raw_mpi
SMALL=(all_reduce -b 8 -e 8 -w 1000 -t 0.5 --json)
BIG=(all_reduce -b 64M -e 64M -w 1 -t 1 --json)

median_of() { python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["results"][0]["time_median_us"])'; }
one() {
  case $1 in
    default) env -u IDIST_BIND "$RUN" -n 2 "$BENCH" "${@:2}" ;;
    no-bind) "$RUN" --no-bind -n 2 "$BENCH" "${@:2}" ;;
    mpirun) mpirun --allow-run-as-root -np 2 "$RAW_MPI" "${@:2}" ;;
  esac 2>/dev/null | median_of
}

echo "# $(date -u +%FT%TZ) $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg)"
ways=(default no-bind mpirun)
declare -A all
for r in $(seq 1 "$ROUNDS"); do
  line="round $r (load $(cut -d' ' -f1 /proc/loadavg)):"
  for k in 0 1 2; do
    w=${ways[$(((r + k) % 3))]}
    t=$(one "$w" "${SMALL[@]}")
    all[$w]+="$t "
    line+=" $w $t us;"
  done
  echo "$line"
done
wins=0
read -ra d <<<"${all[default]:-}"
read -ra m <<<"${all[mpirun]:-}"
for i in "${!d[@]}"; do python3 -c "import sys; sys.exit(0 if ${d[$i]} <= ${m[$i]} else 1)" && wins=$((wins + 1)); done
for w in "${ways[@]}"; do echo "8 B $w: ${all[$w]:-}"; done
echo "8 B: default at most mpirun's time in $wins of $ROUNDS rounds"

declare -A big
for r in $(seq 1 "$LARGE"); do
  line="64 MiB round $r (load $(cut -d' ' -f1 /proc/loadavg)):"
  for k in 0 1 2; do
    w=${ways[$(((r + k) % 3))]}
    t=$(one "$w" "${BIG[@]}")
    big[$w]+="$t "
    line+=" $w $t us;"
  done
  echo "$line"
done
for w in "${ways[@]}"; do echo "64 MiB $w: ${big[$w]:-}"; done
echo "# end $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)"
