#!/bin/bash
# The Debian packages, round trip: cpack -G DEB, dpkg -i into this machine's /usr, an outside
# consumer built against /usr with no flags or hints (CMake and pkg-config) and run under the
# installed idist-run, the mpi plugin from the package under mpirun, then dpkg --purge.
# usage: deb.sh BUILD_DIR SOURCE_DIR     exits 77 (skipped) unless root with dpkg and cpack
source "$(dirname "$0")/lib.sh"
BUILD=$1
SRC=$2
skip() { echo "SKIP: $1"; exit 77; }
[ "$(id -u)" = 0 ] || skip "installing packages into /usr needs root"
for tool in dpkg cpack dpkg-shlibdeps; do
  command -v $tool >/dev/null || skip "no $tool (scripts/setup.sh installs dpkg-dev)"
done
ours="idist idist-dev idist-backend-mpi idist-backend-nccl idist-torch"
# Someone's own installation is never touched: a package of ours, or files put in /usr by hand
# (cmake --install --prefix /usr), which dpkg -i would overwrite and --purge delete.
for pkg in $ours; do
  dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'install ok' && skip "$pkg is already installed on this machine"
done
for f in /usr/bin/idist-run /usr/include/idist /usr/lib/libidist.so.0 /usr/lib/*/libidist.so.0 /usr/lib/cmake/idist; do
  [ -e "$f" ] && skip "$f exists already (an idist installed by hand): not touching it"
done
TMP=$(mktemp -d)
cleanup() {
  # shellcheck disable=SC2086
  dpkg --purge $ours >/dev/null 2>&1
  rm -rf "$TMP"
}
trap cleanup EXIT

(cd "$TMP" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$TMP/debs") >"$TMP/cpack.log" 2>&1
check "cpack -G DEB builds the packages" equals $? 0 || { tail -20 "$TMP/cpack.log"; finish; exit 1; }
debs=$(cd "$TMP/debs" && ls ./*.deb 2>/dev/null | sed 's|^\./||' | tr '\n' ' ')
echo "# packages: $debs"
field() { dpkg-deb -f "$TMP/debs/$1"_*.deb "$2" 2>/dev/null; }
for pkg in idist idist-dev; do
  check "$pkg package built" test -n "$(ls "$TMP/debs/$pkg"_*.deb 2>/dev/null)"
  echo "# $pkg: Depends: $(field $pkg Depends)"
done
check "idist depends on Debian's gloo, spdlog and fmt (dpkg-shlibdeps)" \
  bash -c "grep -q libgloo0 <<<'$(field idist Depends)' && grep -q libspdlog <<<'$(field idist Depends)'"
check "idist needs neither MPI nor CUDA: $(field idist Depends)" bash -c "! grep -qE 'mpi|cuda|nccl' <<<'$(field idist Depends)'"
check "idist ships a shlibs file (for dpkg-shlibdeps of programs linking libidist)" \
  bash -c "dpkg-deb -I $TMP/debs/idist_*.deb | grep -qw shlibs"
check "idist-dev depends on idist of the same version" contains "$(field idist-dev Depends)" "idist (= 0.1.0)"
files() { dpkg-deb -c "$TMP/debs/$1"_*.deb | awk '{print $6}'; }
check "idist holds no header, idist-dev no versioned library" \
  bash -c "! grep -q '\.hpp$' <<<'$(files idist)' && ! grep -q '\.so\.0' <<<'$(files idist-dev)'"
install=("$TMP/debs/idist_"*.deb "$TMP/debs/idist-dev_"*.deb)
mpi_deb=$(ls "$TMP/debs/idist-backend-mpi_"*.deb 2>/dev/null)
if [ -n "$mpi_deb" ]; then
  echo "# idist-backend-mpi: Depends: $(field idist-backend-mpi Depends)"
  check "idist-backend-mpi depends on idist (= 0.1.0) and Open MPI's library" \
    bash -c "grep -q 'idist (= 0.1.0)' <<<'$(field idist-backend-mpi Depends)' && grep -q libopenmpi <<<'$(field idist-backend-mpi Depends)'"
  install+=("$mpi_deb")
fi
torch_deb=$(ls "$TMP/debs/idist-torch_"*.deb 2>/dev/null)
if [ -n "$torch_deb" ]; then
  echo "# idist-torch: Depends: $(field idist-torch Depends)"
  check "idist-torch depends on idist-dev (= 0.1.0) and Debian's libtorch" \
    bash -c "grep -q 'idist-dev (= 0.1.0)' <<<'$(field idist-torch Depends)' && grep -q libtorch <<<'$(field idist-torch Depends)'"
  check "idist-torch holds the library, its header, CMake targets and pkg-config file" bash -c \
    "grep -q 'libidist-torch.so.0' <<<'$(files idist-torch)' && grep -q 'idist/torch.hpp' <<<'$(files idist-torch)' && grep -q 'idistTorchTargets.cmake' <<<'$(files idist-torch)' && grep -q 'idist-torch.pc' <<<'$(files idist-torch)'"
  install+=("$torch_deb")
fi
# The nccl plugin's package would need CUDA from outside Debian: built where CUDA is, not installed here.

dpkg -i "${install[@]}" >"$TMP/dpkg.log" 2>&1
check "dpkg -i installs them" equals $? 0 || { tail -20 "$TMP/dpkg.log"; finish; exit 1; }
check "/usr/bin/idist-run is installed" test -x /usr/bin/idist-run
# lib or lib/<multiarch>, whichever the build was configured with (cmake/package.cmake).
LIBDIR=$(files idist | sed -n 's|^\./\(.*\)/libidist\.so\.0$|/\1|p')
echo "# idist: libraries in $LIBDIR"
out=$(/usr/bin/idist-run --version 2>&1)
check "the installed idist-run runs: $out" contains "$out" "idist-run 0.1.0"

# A consumer that knows nothing of idist's location: no CMAKE_PREFIX_PATH, no -I, no -L, no rpath.
env -u CMAKE_PREFIX_PATH -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH bash -c "
  cmake -S '$SRC/tests/e2e/consumer' -B '$TMP/consumer' && cmake --build '$TMP/consumer'" >"$TMP/cmake.log" 2>&1
check "the outside CMake project builds against /usr with find_package(idist) alone" equals $? 0 || tail -20 "$TMP/cmake.log"
check "... finding the package in /usr" bash -c "grep -q 'idist_DIR:PATH=/usr/' '$TMP/consumer/CMakeCache.txt'"
loaded=$(env -u LD_LIBRARY_PATH ldd "$TMP/consumer/consumer" | awk '/libidist.so.0/ {print $3}')
check "... and loading the packaged libidist: $loaded" equals "$(readlink -f "$loaded")" "$(readlink -f "$LIBDIR/libidist.so.0.1.0")"
out=$(env -u LD_LIBRARY_PATH timeout 60 /usr/bin/idist-run -n 3 "$TMP/consumer/consumer" 2>&1)
check "... and runs on 3 ranks under /usr/bin/idist-run: $out" contains "$out" "consumer: 3 ranks, all_reduce right"
out=$(env -u LD_LIBRARY_PATH timeout 60 "$TMP/consumer/spawn_consumer" 2>&1)
check "... and its idist::spawn program too: $out" contains "$out" "spawn consumer: 2 ranks, all_reduce right"

flags=$(env -u PKG_CONFIG_PATH pkg-config --cflags --libs idist)
check "pkg-config finds idist in /usr: $flags" equals $? 0
# shellcheck disable=SC2086
env -u LD_LIBRARY_PATH g++ "$SRC/tests/e2e/consumer/main.cpp" -o "$TMP/pc_consumer" $flags 2>"$TMP/gcc.log"
check "g++ main.cpp \$(pkg-config --cflags --libs idist) builds, no other flag" equals $? 0 || cat "$TMP/gcc.log"
out=$(env -u LD_LIBRARY_PATH timeout 60 /usr/bin/idist-run -n 2 "$TMP/pc_consumer" 2>&1)
check "... and runs on 2 ranks: $out" contains "$out" "consumer: 2 ranks, all_reduce right"

if [ -n "$torch_deb" ]; then
  flags=$(env -u PKG_CONFIG_PATH pkg-config --cflags --libs idist-torch)
  check "pkg-config finds idist-torch in /usr" equals $? 0
  # shellcheck disable=SC2086
  env -u LD_LIBRARY_PATH g++ "$SRC/tests/e2e/consumer_torch/main.cpp" -o "$TMP/pc_torch" $flags 2>"$TMP/gcc_torch.log"
  check "g++ main.cpp \$(pkg-config --cflags --libs idist-torch) builds a libtorch program" equals $? 0 || tail -5 "$TMP/gcc_torch.log"
  out=$(env -u LD_LIBRARY_PATH timeout 60 /usr/bin/idist-run -n 2 "$TMP/pc_torch" 2>&1)
  check "... and runs on 2 ranks: $out" contains "$out" "torch consumer: 2 ranks, all_reduce and auto_model right"
fi

if [ -n "$mpi_deb" ] && command -v mpirun >/dev/null; then
  check "the mpi plugin lies where libidist looks: $LIBDIR/idist" test -e "$LIBDIR/idist/libidist-backend-mpi.so"
  out=$(env -u LD_LIBRARY_PATH -u IDIST_PLUGIN_PATH timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 \
    /usr/bin/idist-run --backend mpi "$TMP/pc_consumer" 2>&1)
  check "mpirun -np 2 idist-run --backend mpi loads the packaged plugin: $(tail -1 <<<"$out")" \
    contains "$out" "consumer: 2 ranks, all_reduce right"
fi

# shellcheck disable=SC2086
dpkg --purge $ours >"$TMP/purge.log" 2>&1
check "dpkg --purge removes them" equals $? 0 || cat "$TMP/purge.log"
check "nothing of idist is left in /usr" bash -c \
  "! ls /usr/bin/idist-run $LIBDIR/libidist* /usr/include/idist $LIBDIR/cmake/idist $LIBDIR/idist 2>/dev/null | grep -q ."
finish
