#!/bin/bash
# Sets everything up, then runs the whole test suite through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
status=0
ctest --test-dir build --output-on-failure -j 2 "$@" || status=$?
# The package's figures, which passing tests do not show: exported symbols, load-time needs,
# the Debian packages and their Depends (tests/e2e/plugins.sh, deb.sh).
grep -hE '^# (lib|packages|idist)' build/Testing/Temporary/LastTest.log 2>/dev/null | sort -u | sed 's/^/package: /' || true
exit $status
