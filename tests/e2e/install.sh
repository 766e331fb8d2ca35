#!/bin/bash
# The installed package: cmake --install into a fresh prefix, then a project outside the tree
# builds against it with find_package(idist CONFIG) and with pkg-config, and both binaries run
# under the installed idist-run. Also the man page and --version.
# usage: install.sh BUILD_DIR SOURCE_DIR
source "$(dirname "$0")/lib.sh"
BUILD=$1
SRC=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix

cmake --install "$BUILD" --prefix "$PREFIX" >"$TMP/install.log" 2>&1
check "cmake --install into a fresh prefix" equals $? 0
for f in bin/idist-run lib/libidist.so lib/libidist-launch.so include/idist/idist.hpp include/idist/helpers.hpp \
  include/idist/launch.hpp lib/pkgconfig/idist-launch.pc \
  lib/cmake/idist/idistConfig.cmake lib/cmake/idist/idistConfigVersion.cmake lib/pkgconfig/idist.pc; do
  check "installed: $f" test -e "$PREFIX/$f"
done
check "no gloo, MPI or NCCL header is needed by the installed headers" \
  bash -c "! grep -rlE '#include <(gloo|mpi|nccl|spdlog|boost)' '$PREFIX/include/idist'"

out=$("$PREFIX/bin/idist-run" --version)
check "installed idist-run --version names the version and backends: $out" contains "$out" "idist-run 0.1.0 (backends: gloo"
if command -v help2man >/dev/null; then
  check "installed: share/man/man1/idist-run.1" test -e "$PREFIX/share/man/man1/idist-run.1"
  check "the man page documents the options and examples" \
    eval 'grep -q "nproc\\\\-per\\\\-node" "$PREFIX/share/man/man1/idist-run.1" && grep -q "^.SH EXAMPLES" "$PREFIX/share/man/man1/idist-run.1"'
  if command -v man >/dev/null; then
    check "man renders it" eval 'man -l "$PREFIX/share/man/man1/idist-run.1" 2>/dev/null | grep -q "idist-run"'
  fi
else
  echo "# SKIP: the man page: help2man is not installed (scripts/setup.sh installs it)"
fi

# CMake consumer, configured against the prefix only (no hint of the build tree).
cmake -S "$SRC/tests/e2e/consumer" -B "$TMP/consumer" -DCMAKE_PREFIX_PATH="$PREFIX" >"$TMP/cmake.log" 2>&1 &&
  cmake --build "$TMP/consumer" >>"$TMP/cmake.log" 2>&1
check "a CMake project builds with find_package(idist CONFIG)" equals $? 0 || tail -20 "$TMP/cmake.log"
out=$("$PREFIX/bin/idist-run" -n 3 "$TMP/consumer/consumer" 2>&1)
check "... and runs on 3 ranks under the installed idist-run: $out" contains "$out" "consumer: 3 ranks, all_reduce right"
out=$(timeout 60 "$TMP/consumer/spawn_consumer" 2>&1)
check "... and idist::launch's spawn starts its own ranks, run plainly: $out" contains "$out" "spawn consumer: 2 ranks, all_reduce right"
out=$(ctest --test-dir "$TMP/consumer" 2>&1)
check "... and its add_test with IDIST_RUN from the package passes" contains "$out" "100% tests passed"

# idist::torch, where the build has it: find_package(idist COMPONENTS torch) from the prefix.
if [ -e "$PREFIX/lib/libidist-torch.so" ]; then
  for f in include/idist/torch.hpp lib/cmake/idist/idistTorchTargets.cmake lib/pkgconfig/idist-torch.pc; do
    check "installed: $f" test -e "$PREFIX/$f"
  done
  cmake -S "$SRC/tests/e2e/consumer_torch" -B "$TMP/consumer_torch" -DCMAKE_PREFIX_PATH="$PREFIX" >"$TMP/cmake_torch.log" 2>&1 &&
    cmake --build "$TMP/consumer_torch" >>"$TMP/cmake_torch.log" 2>&1
  check "a libtorch project builds with find_package(idist COMPONENTS torch)" equals $? 0 || tail -20 "$TMP/cmake_torch.log"
  out=$("$PREFIX/bin/idist-run" -n 2 "$TMP/consumer_torch/torch_consumer" 2>&1)
  check "... and runs on 2 ranks: $out" contains "$out" "torch consumer: 2 ranks, all_reduce and auto_model right"
  cmake -S "$SRC/tests/e2e/consumer" -B "$TMP/consumer_no_torch" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null 2>&1
  check "find_package(idist) without the component does not need libtorch" equals $? 0
else
  echo "# SKIP: idist::torch is not in this build (no libtorch)"
fi

# pkg-config consumer: a plain compiler line.
flags=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --cflags --libs idist)
rc=$?
check "pkg-config knows idist $(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --modversion idist)" equals $rc 0
# shellcheck disable=SC2086
g++ "$SRC/tests/e2e/consumer/main.cpp" -o "$TMP/pc_consumer" $flags -Wl,-rpath,"$PREFIX/lib" 2>"$TMP/gcc.log"
check "a program builds with \$(pkg-config --cflags --libs idist)" equals $? 0 || cat "$TMP/gcc.log"
out=$("$PREFIX/bin/idist-run" -n 2 "$TMP/pc_consumer" 2>&1)
check "... and runs on 2 ranks: $out" contains "$out" "consumer: 2 ranks, all_reduce right"
flags=$(PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig" pkg-config --cflags --libs idist-launch)
# shellcheck disable=SC2086
g++ "$SRC/tests/e2e/consumer/spawn_main.cpp" -o "$TMP/pc_spawn" $flags -Wl,-rpath,"$PREFIX/lib" 2>"$TMP/gcc.log"
check "a spawning program builds with \$(pkg-config --cflags --libs idist-launch)" equals $? 0 || cat "$TMP/gcc.log"
out=$(timeout 60 "$TMP/pc_spawn" 2>&1)
check "... and starts its 2 ranks: $out" contains "$out" "spawn consumer: 2 ranks, all_reduce right"

finish
