#!/bin/bash
# Builds the libFuzzer targets with clang into a scratch folder and runs each for a bounded
# time over its seed corpus (corpus/<target>/) and past bugs (regressions/<target>/).
#   tests/fuzz/run.sh [BUILD_DIR]     FUZZ_SECONDS=20 per target, FUZZ_CXX=clang++
# Exits 0 when no target crashed, 1 when one did (the input is saved; keep it under
# regressions/<target>/ once fixed), 77 when clang or libFuzzer is missing (ctest: skipped).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-${TMPDIR:-/tmp}/idist-fuzz}
seconds=${FUZZ_SECONDS:-20}
cxx=${FUZZ_CXX:-clang++}
targets=(store_wire hostlist env)

skip() { echo "SKIPPED: $*"; exit 77; }
command -v "$cxx" >/dev/null || skip "no $cxx (scripts/setup.sh installs clang and libclang-rt-14-dev)"
command -v cmake >/dev/null || skip "no cmake"
mkdir -p "$build" || exit 1
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$build/probe.cpp"
"$cxx" -fsanitize=fuzzer,address,undefined "$build/probe.cpp" -o "$build/probe" 2>"$build/probe.log" ||
  skip "$cxx cannot link libFuzzer with ASan/UBSan (libclang-rt-14-dev missing?): $(head -c 300 "$build/probe.log")"

cmake -S "$here" -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" || exit 1

failed=()
for t in "${targets[@]}"; do
  # New inputs go to a scratch copy: the corpus kept in git stays small and reviewed.
  work="$build/corpus/$t"
  rm -rf "$work" "$build/artifacts/$t"
  mkdir -p "$work" "$build/artifacts/$t"
  dirs=("$work" "$here/corpus/$t")
  [ -d "$here/regressions/$t" ] && dirs+=("$here/regressions/$t")
  echo "== fuzz_$t for ${seconds} s"
  # libFuzzer exits 77 on a crash by default, which ctest would read as skipped.
  "$build/fuzz_$t" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
    -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$t/" "${dirs[@]}" >"$build/$t.log" 2>&1
  rc=$?
  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$build/$t.log"
  echo "   corpus: $(ls "$work" | wc -l) new inputs"
  if [ $rc -ne 0 ]; then
    tail -n 40 "$build/$t.log"
    echo "fuzz_$t FAILED (exit $rc); reproducer(s): $(ls "$build/artifacts/$t/" | sed "s|^|$build/artifacts/$t/|" | tr '\n' ' ')"
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing found bugs in: ${failed[*]}"
  exit 1
fi
echo "fuzzing: ${targets[*]}: no crash in ${seconds} s each"
