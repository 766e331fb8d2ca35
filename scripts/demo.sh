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
)
install_missing demo "${DEMO_PACKAGES[@]}"
# Its own build folder, unoptimized, without tests, optional backends or the etcd rendezvous
# (its client and OpenSSL), and as a unity build: compiling is what the first result waits for,
# and at -O0 it is mostly the parsing of Asio, spdlog and json, which a unity build does once
# per batch of files (CPU time 170 s against 385 s file by file; -O0 was 153 s of wall time
# where -O2 took 218 and -O2 -g 292). The tour and scripts/test.sh build everything, optimized,
# into build/. In one unity file, a struct of a header's class holding a type of a .cpp's
# anonymous namespace draws GCC's -Wsubobject-linkage, which file by file it does not: silenced.
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=None "-DCMAKE_CXX_FLAGS=-O0 -Wno-subobject-linkage" -DCMAKE_UNITY_BUILD=ON \
  -DIDIST_BUILD_TESTS=OFF -DIDIST_WITH_MPI=OFF -DIDIST_WITH_UCX=OFF -DIDIST_WITH_TORCH=OFF \
  -DIDIST_WITH_ETCD=OFF >/dev/null
cmake --build build-demo -j "$(nproc)" --target idist-run all_reduce all_reduce_spawn
echo "+ idist-run -n 3 all_reduce"
build-demo/apps/idist-run/idist-run -n 3 build-demo/apps/examples/all_reduce
echo "+ all_reduce_spawn   (idist::spawn(all_reduce_example, {.backend = \"gloo\", .nproc_per_node = 3}))"
build-demo/apps/examples/all_reduce_spawn
