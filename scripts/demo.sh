#!/bin/bash
# The first result, quickly: installs only the Debian packages the demo needs (apt-get, those
# missing), builds only idist-run, libidist and the two examples it runs (no tests, no optional
# backend), then runs the seed tutorial's all_reduce on 3 gloo ranks through idist-run, then in
# the tutorial's own form (idist::spawn, the program starts its 3 ranks): every rank prints
# [9, 12].
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install_missing.sh
DEMO_PACKAGES=(
  g++ cmake make pkg-config                                       # toolchain
  libgloo-dev                                                     # the gloo backend
  libcli11-dev libspdlog-dev nlohmann-json3-dev libboost1.81-dev  # CLI, logging, JSON, Asio
  libssl-dev                                                      # idist-run speaks TLS to etcd
)
install_missing demo "${DEMO_PACKAGES[@]}"
# Its own build folder, unoptimized and without tests or optional backends: compiling is what
# the first result waits for (2 cores: 153 s at -O0 against 218 at -O2 and 292 with -g). The
# tour and scripts/test.sh build everything, optimized, into build/.
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O0 -DIDIST_BUILD_TESTS=OFF \
  -DIDIST_WITH_MPI=OFF -DIDIST_WITH_UCX=OFF -DIDIST_WITH_TORCH=OFF >/dev/null
cmake --build build-demo -j "$(nproc)" --target idist-run all_reduce all_reduce_spawn
echo "+ idist-run -n 3 all_reduce"
build-demo/apps/idist-run/idist-run -n 3 build-demo/apps/examples/all_reduce
echo "+ all_reduce_spawn   (idist::spawn(all_reduce_example, {.backend = \"gloo\", .nproc_per_node = 3}))"
build-demo/apps/examples/all_reduce_spawn
