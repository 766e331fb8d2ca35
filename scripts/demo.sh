#!/bin/bash
# Sets everything up, then runs the seed tutorial's all_reduce on 3 gloo ranks through
# idist-run, then in the tutorial's own form (idist::spawn, the program starts its 3 ranks):
# every rank prints [9, 12].
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "+ idist-run -n 3 all_reduce"
build/apps/idist-run/idist-run -n 3 build/apps/examples/all_reduce
echo "+ all_reduce_spawn   (idist::spawn(all_reduce_example, {.backend = \"gloo\", .nproc_per_node = 3}))"
build/apps/examples/all_reduce_spawn
