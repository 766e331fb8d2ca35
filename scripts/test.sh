#!/bin/bash
# Sets everything up, then runs the whole test suite through ctest. With --fast: only the fast
# layer, after an incremental build (set-up done before).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --fast ]; then
  # The layer to run after each change (tests/README.md): no set-up, an incremental build,
  # then the entries labelled fast, under a minute on 2 cores.
  shift
  cmake --build build -j "$(nproc)" >/dev/null
  exec ctest --test-dir build --output-on-failure -j 2 -L fast "$@"
fi
bash scripts/setup.sh
status=0
ctest --test-dir build --output-on-failure -j 2 "$@" || status=$?
# The package's figures, which passing tests do not show: exported symbols, load-time needs,
# the Debian packages and their Depends (tests/e2e/plugins.sh, deb.sh).
grep -hE '^# (lib|packages|idist)' build/Testing/Temporary/LastTest.log 2>/dev/null | sort -u | sed 's/^/package: /' || true
# Each failed check with its test, last: a CI log shows its head and tail, and a failing test's
# own output may fall between them.
awk '/^[0-9]+\/[0-9]+ Testing: / { test = $3 } /^not ok/ { print "failed check: " test ": " $0 }' \
  build/Testing/Temporary/LastTest.log 2>/dev/null || true
exit $status
