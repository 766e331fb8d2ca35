#!/bin/bash
# One host, 2 ranks, as users run them: idist built from two trees (say, before and after a
# change) and Open MPI, each by its default (`idist-run -n 2 idist-bench`, `mpirun -np 2
# raw_mpi`), all_reduce from 8 B to 256 MiB (x2 each step, so 1 MiB is measured, not inferred),
# alternating, the order turned each round, so that the three share the machine's mode of the
# moment. Prints per size the median of the rounds' medians for each, the after/before and
# after/Open MPI ratios, and in how many rounds after took at most before's and Open MPI's time.
#   usage: [BEGIN=8] [END=256M] bench/two_trees.sh BEFORE_BUILD AFTER_BUILD DATA_DIR [ROUNDS]
# raw_mpi comes from AFTER_BUILD (configured with -DIDIST_WITH_MPI=ON).
set -euo pipefail
BEFORE=$(realpath "$1")
AFTER=$(realpath "$2")
DATA=$(mkdir -p "$3" && realpath "$3")
ROUNDS=${4:-3}
SWEEP=(all_reduce -b "${BEGIN:-8}" -e "${END:-256M}" -f 2 -w 3 -t 0.2 --json)
run_way() {  # run_way WAY OUT
  case $1 in
    before) "$BEFORE/apps/idist-run/idist-run" -n 2 "$BEFORE/apps/idist-bench/idist-bench" "${SWEEP[@]}" >"$2" ;;
    after) "$AFTER/apps/idist-run/idist-run" -n 2 "$AFTER/apps/idist-bench/idist-bench" "${SWEEP[@]}" >"$2" ;;
    mpi) mpirun --allow-run-as-root -np 2 "$AFTER/bench/raw_mpi" "${SWEEP[@]}" >"$2" ;;
  esac
}
for r in $(seq 1 "$ROUNDS"); do
  order="before after mpi"
  [ $((r % 2)) -eq 0 ] && order="mpi after before"
  for way in $order; do
    run_way "$way" "$DATA/$way-$r.json"
    echo "two_trees: round $r, $way done" >&2
  done
done
python3 - "$DATA" "$ROUNDS" <<'PY'
import json, statistics as st, sys
data, rounds = sys.argv[1], int(sys.argv[2])
def medians(path):
    return {x['size']: x['time_median_us'] for x in json.load(open(path))['results']}
runs = {way: [medians(f'{data}/{way}-{r}.json') for r in range(1, rounds + 1)] for way in ('before', 'after', 'mpi')}
print('| size | before us | after us | Open MPI us | after/before | after/Open MPI | rounds after <= before | rounds after <= Open MPI |')
print('|---:|---:|---:|---:|---:|---:|---:|---:|')
for size in sorted(runs['after'][0]):
    b, a, m = ([run[size] for run in runs[way]] for way in ('before', 'after', 'mpi'))
    name = f'{size >> 20} MiB' if size >= 1 << 20 else f'{size >> 10} KiB' if size >= 1024 else f'{size} B'
    print(f'| {name} | {st.median(b):,.2f} | {st.median(a):,.2f} | {st.median(m):,.2f} | {st.median(a) / st.median(b):.2f} | '
          f'{st.median(a) / st.median(m):.2f} | {sum(x <= y for x, y in zip(a, b))} of {rounds} | '
          f'{sum(x <= y for x, y in zip(a, m))} of {rounds} |')
PY
