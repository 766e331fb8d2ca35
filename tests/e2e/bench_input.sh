#!/bin/bash
# idist-bench's bad input, as a table: sizes of 0, a negative root, a size that is not whole
# elements of the dtype, a sweep whose buffers cannot fit in this host's memory. Each is run
# by itself and as a job of 2 ranks under idist-run (and mpirun where there is one), and
# passes when:
#   - it exits 2 (idist-bench's usage errors, as idist-run's),
#   - the refusal is one line naming the option and its value (by itself: stderr is that one
#     line; in a job: every rank says the same line, and idist-run's summary follows),
#   - nothing says std::bad_alloc, terminate, or CLI11's "not in range 0 to <309 digits>",
#   - stdout is empty (nothing was run), and it took under 10 s.
# Then what must still run: sizes that are whole elements but no power of two, barrier alone
# whatever -b says, and a sweep that fits the memory check but not the address space (ulimit
# -v) ends in one line, not std::bad_alloc.
# usage: bench_input.sh IDIST_RUN IDIST_BENCH [RAW_GLOO]
source "$(dirname "$0")/lib.sh"
RUN=$1
BENCH=$2
RAW_GLOO=${3:-}
export IDIST_TIMEOUT=60
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
MPIRUN=(timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none)
FAST=(-w 1 -n 2)

# refused HOW NEEDLE CMD...: HOW is "alone" (one process), "job" (2 ranks under idist-run, and
# its summary) or "mpirun" (2 ranks under mpirun).
refused() {
  local how=$1 needle=$2
  shift 2
  local start rc ms why="" shown="${*##*/}"
  start=$(now_ms)
  timeout 30 "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
  ms=$(($(now_ms) - start))
  local err ours
  err=$(cat "$TMP/err")
  ours=$(grep '^idist-bench: \|^raw_gloo: ' <<<"$err" | sort -u)
  [ "$rc" = 2 ] || why+=" exit $rc, not 2;"
  [ "$(wc -l <<<"$ours")" = 1 ] && [ -n "$ours" ] || why+=" not one distinct line of its own;"
  contains "$ours" "$needle" || why+=" does not say '$needle';"
  case $how in
    alone) [ "$(wc -l <<<"$err")" = 1 ] || why+=" stderr is not one line;" ;;
    # Apart from the ranks' one line, only idist-run speaks (mpirun's own words vary).
    job) grep -v '^idist-bench: \|^raw_gloo: \|^idist-run: ' <<<"$err" | grep -q . && why+=" other lines on stderr;" ;;
  esac
  grep -q 'bad_alloc\|terminate called\|not in range' "$TMP/err" && why+=" says bad_alloc, terminate or 'not in range';"
  [ -s "$TMP/out" ] && why+=" printed on stdout;"
  [ "$ms" -lt 10000 ] || why+=" took ${ms} ms;"
  if [ -z "$why" ]; then
    check "$how: $shown -> $rc: $ours" true
  else
    check "$how: $shown:$why stderr was: $(head -c 600 "$TMP/err" | tr '\n' '|')" false
  fi
}

# row NEEDLE ARGS...: refused by itself and as a job of 2 ranks under idist-run.
row() {
  local needle=$1
  shift
  refused alone "$needle" "$BENCH" "$@"
  refused job "$needle" "$RUN" -n 2 "$BENCH" "$@"
}

echo "# sizes and the root"
row "-b 0: the size must be at least 1 byte" -b 0
refused alone "--min-bytes 0: the size must be at least 1 byte" "$BENCH" --min-bytes 0
row "-e 0: the size must be at least 1 byte" -e 0
row "-r -1: the root must be a rank, 0 or more" -r -1
refused alone "--root -1: the root must be a rank" "$BENCH" --root=-1
row "larger than --max-bytes" -b 1T

echo "# whole elements of every dtype"
row "-b 9 is not a multiple of float32's 4 bytes" -b 9 -d float32
row "-b 3 is not a multiple of float64's 8 bytes" -b 3 -d float64
row "-b 4 is not a multiple of int64's 8 bytes" -b 4 -d all
[ -n "$RAW_GLOO" ] && refused alone "-b 9 is not a multiple of float32's 4 bytes" "$RAW_GLOO" -b 9 -d float32

echo "# sweeps that cannot fit in memory, refused before the first call"
row "-e 1T: the sweep's largest size, 1 TiB" -b 1T -e 1T
EXABYTE="-e 1E: the sweep's largest size, 1 EiB, needs 3.0 EiB per rank (3 buffers of it)"
refused alone "$EXABYTE x 1 rank on this host" "$BENCH" -e 1E
refused job "$EXABYTE x 2 ranks on this host" "$RUN" -n 2 "$BENCH" -e 1E
if command -v mpirun >/dev/null; then
  refused mpirun "$EXABYTE x 2 ranks on this host" "${MPIRUN[@]}" -np 2 "$BENCH" --backend mpi -e 1E
else
  echo "# SKIP mpirun: not installed"
fi

echo "# what must still run"
"$RUN" -n 2 "$BENCH" -b 12 -e 48 -d float32 "${FAST[@]}" all_reduce all_gather >"$TMP/out" 2>&1
check "12 B to 48 B of float32 (whole elements, no power of two) on 2 ranks: exits 0" equals $? 0 ||
  sed 's/^/  | /' "$TMP/out" | tail -5
check "  ... and checks 12, 24 and 48 B" equals "$(grep -cE '^ +all_reduce +(12|24|48) ' "$TMP/out")" 3
"$BENCH" barrier -b 3 -d float64 "${FAST[@]}" >"$TMP/out" 2>&1
check "barrier alone takes no size: -b 3 -d float64 runs, exits 0" equals $? 0 || sed 's/^/  | /' "$TMP/out" | tail -5

# Memory the check counts as available, yet the address space will not give: the one line of
# a rank out of memory, not std::bad_alloc.
avail_kib=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
if [ "${avail_kib:-0}" -lt $((2 * 1024 * 1024)) ]; then
  echo "# SKIP out of memory at run time: MemAvailable under 2 GiB"
else
  (ulimit -v 600000 && exec "$BENCH" -b 256M -e 256M -w 0 -n 1 all_reduce) >"$TMP/out" 2>"$TMP/err"
  rc=$?
  err=$(cat "$TMP/err")
  check "3 buffers of 256 MiB in 600 MB of address space: exit 1" equals $rc 1
  check "  ... one line on stderr, naming -e: $err" equals "$(wc -l <<<"$err") $(count "$err" "lower -e")" "1 1"
  check "  ... not std::bad_alloc" test "$(count "$err" bad_alloc)" = 0
fi

finish
