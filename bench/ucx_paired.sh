#!/bin/bash
# ucx against Open MPI between two fake hosts, in pairs: each round runs bench/ucx_two_hosts.sh
# with ucx then Open MPI, and again in the other order, so that both ways of a pair share this
# machine's mode of the moment (a 2-core guest whose speed drifts 2x within minutes: a sweep's
# best median says more about when each way ran than about the way). Prints per size the
# median of the runs' medians for each way, in how many pairs ucx took at most Open MPI's time,
# and the best of each.
#   usage: [BEGIN=64K] [END=64M] bench/ucx_paired.sh BUILD_DIR DATA_DIR PPN [ROUNDS]   (root, ip netns)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$1
DATA=$(mkdir -p "$2" && realpath "$2")
PPN=$3
ROUNDS=${4:-6}
for r in $(seq 1 "$ROUNDS"); do
  for order in "ucx mpi" "mpi ucx"; do
    WAYS=$order BEGIN=${BEGIN:-64K} bash "$ROOT/bench/ucx_two_hosts.sh" "$BUILD" "$DATA/$r-${order%% *}" 1 "$PPN" >/dev/null
  done
done
python3 - "$DATA" "$PPN" <<'PY'
import glob, json, statistics as st, sys
data, ppn = sys.argv[1], sys.argv[2]
def medians(path):
    return {x['size']: x['time_median_us'] for x in json.load(open(path))['results']}
pairs = {}
for run in sorted(glob.glob(f'{data}/*/ucx-{ppn}-1.json')):
    u, m = medians(run), medians(run.replace('/ucx-', '/mpi-'))
    for size in u:
        pairs.setdefault(size, []).append((u[size], m[size]))
print('| size | ucx median of runs us | Open MPI median of runs us | ratio of medians | runs ucx <= Open MPI | ucx best | Open MPI best |')
print('|---:|---:|---:|---:|---:|---:|---:|')
for size in sorted(pairs):
    u = [a for a, _ in pairs[size]]
    m = [b for _, b in pairs[size]]
    name = f'{size >> 20} MiB' if size >= 1 << 20 else f'{size >> 10} KiB' if size >= 1024 else f'{size} B'
    print(f'| {name} | {st.median(u):,.0f} | {st.median(m):,.0f} | {st.median(u) / st.median(m):.2f} | '
          f'{sum(a <= b for a, b in pairs[size])} of {len(u)} | {min(u):,.0f} | {min(m):,.0f} |')
PY
