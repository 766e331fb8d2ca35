#!/bin/bash
# Sets everything up, then runs the seed tutorial's all_reduce on 3 gloo ranks through
# idist-run: every rank prints [9, 12].
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "+ idist-run -n 3 all_reduce"
build/apps/idist-run/idist-run -n 3 build/apps/examples/all_reduce
