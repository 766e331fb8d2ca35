#!/bin/bash
# Waits that yield where the job's ranks on the machine outnumber its cores
# (IDIST_CPUS_SHARED=auto, the default) against waits that never yield (=0), beside Open MPI,
# between two fake hosts with 2 ranks each: 4 ranks of one job on this machine's cores, which
# each join counts (the boot id of each rank's host identity). Each round runs
# bench/ucx_two_hosts.sh once per way (auto, 0, Open MPI), so that the three share this
# machine's mode of the moment. Prints per size, for each way, the median of the runs' medians,
# the best run and how many runs were slower than SLOW us (default 60: the slow mode of 4
# spinning ranks on 2 cores).
#   usage: [BEGIN=8] [END=1K] [SLOW=60] bench/ucx_cpus_shared.sh BUILD_DIR DATA_DIR [ROUNDS]   (root, ip netns)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$1
DATA=$(mkdir -p "$2" && realpath "$2")
ROUNDS=${3:-8}
export BEGIN=${BEGIN:-8} END=${END:-1K}
for r in $(seq 1 "$ROUNDS"); do
  for way in auto 0; do
    IDIST_CPUS_SHARED=$way WAYS=ucx bash "$ROOT/bench/ucx_two_hosts.sh" "$BUILD" "$DATA/$r-$way" 1 2 >/dev/null
  done
  WAYS=mpi bash "$ROOT/bench/ucx_two_hosts.sh" "$BUILD" "$DATA/$r-mpi" 1 2 >/dev/null
done
python3 - "$DATA" "${SLOW:-60}" <<'PY'
import glob, json, statistics as st, sys
data, slow = sys.argv[1], float(sys.argv[2])
ways = {'auto': 'ucx, auto', '0': 'ucx, =0', 'mpi': 'Open MPI'}
runs = {}
for way in ways:
    for path in sorted(glob.glob(f'{data}/*-{way}/*-2-1.json')):
        for x in json.load(open(path))['results']:
            runs.setdefault(x['size'], {}).setdefault(way, []).append(x['time_median_us'])
print('| size | ' + ' | '.join(f'{w}: median of runs / best / runs > {slow:g} us' for w in ways.values()) + ' |')
print('|---:|' + '---:|' * len(ways))
for size in sorted(runs):
    name = f'{size >> 20} MiB' if size >= 1 << 20 else f'{size >> 10} KiB' if size >= 1024 else f'{size} B'
    cells = []
    for way in ways:
        v = runs[size].get(way, [])
        cells.append(f'{st.median(v):,.1f} / {min(v):,.1f} / {sum(x > slow for x in v)} of {len(v)}' if v else '')
    print(f'| {name} | ' + ' | '.join(cells) + ' |')
PY
