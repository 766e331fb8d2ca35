#!/bin/bash
# idist-bench in short, as CI runs it: every collective at small sizes, gloo on 2 ranks (8 B to
# 1 MiB) and on 3 ranks (every dtype x every op, up to 4 KiB) through idist-run, mpi on 2 ranks
# through mpirun, and the raw Gloo and MPI references once each. Every --json document must
# hold every collective asked for, with every result checked and #wrong 0. A bad option exits
# 2 with one line. Timings are not judged here (scripts/bench.sh is for figures).
# usage: bench_smoke.sh IDIST_RUN IDIST_BENCH RAW_GLOO [RAW_MPI]      (RAW_MPI: without the mpi backend, "")
source "$(dirname "$0")/lib.sh"
RUN=$1
BENCH=$2
RAW_GLOO=$3
RAW_MPI=${4:-}
export IDIST_TIMEOUT=60
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MPIRUN=(timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none)
FAST=(-w 1 -n 2)  # correctness, not figures: one warm-up call and two timed calls per size

# valid FILE COLLECTIVES...: FILE is one JSON document with a result for each collective named,
# every data-carrying result checked, nothing wrong. Prints what is amiss.
valid() {
  python3 - "$@" <<'EOF'
import json, sys
path, wanted = sys.argv[1], sys.argv[2:]
try:
    doc = json.load(open(path))
except Exception as e:
    sys.exit(f"  not one JSON document: {e}")
problems = []
seen = {r["collective"] for r in doc["results"]}
problems += [f"no {c} results" for c in wanted if c not in seen]
for r in doc["results"]:
    where = f'{r["collective"]} {r["type"]} {r["redop"]} {r["size"]} B'
    if r["wrong"] != 0:
        problems.append(f"{where}: {r['wrong']} wrong")
    if r["collective"] != "barrier" and not r["checked"]:
        problems.append(f"{where}: not checked")
    if r["iters"] < 1 or r["time_us"] <= 0:
        problems.append(f"{where}: no timing")
if doc["wrong"] != 0:
    problems.append(f"{doc['wrong']} wrong in all")
for p in problems[:10]:
    print("  " + p)
sys.exit(1 if problems else 0)
EOF
}

ALL=(all_reduce all_gather broadcast reduce_scatter reduce barrier send_recv)

"$RUN" -n 2 "$BENCH" -b 16 -e 1M -f 4 "${FAST[@]}" --json >"$TMP/gloo2.json"
check "gloo, 2 ranks, 16 B to 1 MiB: exits 0" equals $? 0
check "gloo, 2 ranks: every collective, checked, none wrong" valid "$TMP/gloo2.json" "${ALL[@]}"

"$RUN" -n 3 "$BENCH" -b 8 -e 4K -f 8 -d all -o all -r 2 "${FAST[@]}" --json >"$TMP/gloo3.json"
check "gloo, 3 ranks, every dtype and op, root 2: exits 0" equals $? 0
check "gloo, 3 ranks: every collective, checked, none wrong" valid "$TMP/gloo3.json" "${ALL[@]}"

"$RUN" -n 2 "$RAW_GLOO" -b 16 -e 1M -f 16 "${FAST[@]}" --json >"$TMP/raw_gloo.json"
check "raw_gloo, 2 ranks: exits 0" equals $? 0
check "raw_gloo: every collective, checked, none wrong" valid "$TMP/raw_gloo.json" "${ALL[@]}"

if [ -z "$RAW_MPI" ] || ! command -v mpirun >/dev/null; then
  echo "# skipped the mpi runs: no mpi backend in this build, or no mpirun"
else
  "${MPIRUN[@]}" -np 2 "$BENCH" --backend mpi -b 16 -e 1M -f 4 -d float32,int8,bfloat16 -o sum,max,xor "${FAST[@]}" \
    --json >"$TMP/mpi2.json"
  check "mpi, 2 ranks via mpirun: exits 0" equals $? 0
  check "mpi, 2 ranks: every collective, checked, none wrong" valid "$TMP/mpi2.json" "${ALL[@]}"
  check "mpi: the results say backend mpi" contains "$(head -c 300 "$TMP/mpi2.json")" '"backend": "mpi"'

  "${MPIRUN[@]}" -np 2 "$RAW_MPI" -b 16 -e 1M -f 16 "${FAST[@]}" --json >"$TMP/raw_mpi.json"
  check "raw_mpi, 2 ranks: exits 0" equals $? 0
  check "raw_mpi: every collective, checked, none wrong" valid "$TMP/raw_mpi.json" "${ALL[@]}"
fi

out=$("$RUN" -n 2 "$BENCH" -b 8 -e 64 "${FAST[@]}" all_reduce 2>&1)
check "the table has nccl-tests' columns" contains "$out" "#wrong"
check "the table ends with the verdict" contains "$out" "# Out of bounds values : 0 OK"

bad() {
  local what=$1 expect=$2
  shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null)
  rc=$?
  check "$what: exit 2" equals $rc 2
  check "$what: one line" equals "$(wc -l <<<"$err")" 1
  check "$what: says '$expect'" contains "$err" "$expect"
}
bad "an unknown option" "--bogus" "$BENCH" --bogus
bad "a size that is not one" "--min-bytes" "$BENCH" -b 12Q
bad "min above max" "larger than --max-bytes" "$BENCH" -b 1M -e 1K
bad "an unknown collective" "alltoall" "$BENCH" alltoall
bad "an unknown dtype" "--datatype" "$BENCH" -d float128
bad "a root outside the world" "--root 5 is not a rank" "$BENCH" -r 5
bad "raw_gloo: an unknown option" "--bogus" "$RAW_GLOO" --bogus

finish
