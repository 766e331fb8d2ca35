#!/bin/bash
# libidist's package boundary: what it exports, what it needs at load time, and the backends
# that are plugins (lib/src/backends/plugins.cpp). A gloo program runs with the plugin
# directory empty and with libmpi hidden; asking for a backend whose plugin or library is
# missing is one line naming it.
# usage: plugins.sh IDIST_RUN EXAMPLES_DIR LIBIDIST LIBIDIST_LAUNCH PLUGIN_DIR
source "$(dirname "$0")/lib.sh"
RUN=$1
EX=$2
LIB=$3
LAUNCH=$4
PLUGINS=$5
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# --- exported symbols --------------------------------------------------------------------
foreign='fmt::|spdlog|asio|boost|gloo'
for so in "$LIB" "$LAUNCH"; do
  exported=$(nm -DC --defined-only "$so")
  echo "# $(basename "$so"): $(wc -l <<<"$exported") exported symbols, $(grep -cE "$foreign" <<<"$exported") from fmt/spdlog/asio/gloo"
  check "$(basename "$so") exports no fmt, spdlog, Asio or Gloo symbol" bash -c "! grep -qE '$foreign' <<<'$exported'"
  others=$(grep -vE ' (idist::|typeinfo for idist::|typeinfo name for idist::|vtable for idist::)' <<<"$exported")
  check "$(basename "$so") exports the idist namespace only${others:+: $others}" test -z "$others"
done
exported=$(nm -DC --defined-only "$LIB")
check "libidist.so exports the public API (idist::init, all_reduce's entry, Error)" \
  bash -c "grep -q ' idist::init(' <<<'$exported' && grep -q ' idist::detail::all_reduce(' <<<'$exported' &&
           grep -q 'typeinfo for idist::Error' <<<'$exported'"
for plugin in "$PLUGINS"/libidist-backend-*.so; do
  [ -e "$plugin" ] || continue
  name=$(basename "$plugin" .so)
  name=${name#libidist-backend-}
  out=$(nm -D --defined-only "$plugin" | awk '{print $3}')
  check "$(basename "$plugin") exports its entry point only: $out" equals "$out" "idist_backend_plugin_$name"
done

# --- load-time needs -----------------------------------------------------------------------
needed=$(readelf -d "$LIB" | grep NEEDED | grep -o '\[.*\]' | tr '\n' ' ')
echo "# libidist.so needs: $needed"
check "libidist.so needs neither MPI nor CUDA nor NCCL nor UCX at load time" \
  bash -c "! grep -qE 'libmpi|libcuda|libnccl|libucp|libuct|libucs' <<<'$needed'"

# --- a gloo program with no plugin beside libidist -------------------------------------------
# A copy of libidist with an empty idist/ beside it: LD_LIBRARY_PATH comes before the
# examples' RUNPATH, so they load the copy, which looks for plugins in $TMP/lib/idist.
mkdir -p "$TMP/lib/idist"
cp -P "$(dirname "$LIB")"/libidist.so* "$TMP/lib/"
export LD_LIBRARY_PATH=$TMP/lib
check "the examples load the copy of libidist" bash -c "ldd '$EX/all_reduce' | grep -q '$TMP/lib/libidist.so'"
out=$(timeout 60 "$RUN" -n 3 "$EX/all_reduce" 2>&1)
check "gloo all_reduce on 3 ranks with the plugin directory empty" contains "$out" "Rank 2, After performing all_reduce: [9, 12]"
# The program alone is a world of one: init loads the plugin all the same.
out=$(IDIST_BACKEND=mpi timeout 60 "$EX/all_reduce" 2>&1)
rc=$?
check "the mpi backend without its plugin fails (exit $rc)" test "$rc" -ne 0 -a "$rc" -ne 124
want="backend 'mpi' is not installed: no libidist-backend-mpi.so in $TMP/lib/idist (install idist-backend-mpi"
check "... with one line naming the plugin and where it was looked for" contains "$out" "$want" || echo "$out" | head -5
out=$(IDIST_PLUGIN_PATH=/nowhere:/neither timeout 60 "$RUN" -n 2 --backend nccl "$EX/all_reduce" 2>&1)
check "... under idist-run too, from both ranks" \
  bash -c "grep -q 'rank 0/2.*is not installed' <<<\"\$1\" && grep -q 'rank 1/2.*is not installed' <<<\"\$1\"" _ "$out"
check "IDIST_PLUGIN_PATH's directories are searched first and named" \
  contains "$out" "backend 'nccl' is not installed: no libidist-backend-nccl.so in /nowhere, /neither, $TMP/lib/idist"

# Something that is not a plugin, and a plugin of another version, in IDIST_PLUGIN_PATH.
mkdir -p "$TMP/bad" "$TMP/old"
head -c 4096 /dev/urandom >"$TMP/bad/libidist-backend-mpi.so"
out=$(IDIST_PLUGIN_PATH=$TMP/bad IDIST_BACKEND=mpi timeout 60 "$EX/all_reduce" 2>&1)
check "a broken plugin file is named with the loader's reason" \
  contains "$out" "backend 'mpi': cannot load $TMP/bad/libidist-backend-mpi.so: invalid ELF header"
cat >"$TMP/old.cpp" <<'CPP'
struct Old { int abi; const char* version; void* make; void* layout; };
extern "C" const Old* idist_backend_plugin_mpi() { static Old old{0, "0.0.1", nullptr, nullptr}; return &old; }
CPP
if g++ -shared -fPIC "$TMP/old.cpp" -o "$TMP/old/libidist-backend-mpi.so" 2>"$TMP/gcc.log" &&
  sed 's/_mpi(/_ucx(/' "$TMP/old.cpp" | g++ -shared -fPIC -x c++ - -o "$TMP/old/libidist-backend-ucx.so" 2>>"$TMP/gcc.log"; then
  out=$(IDIST_PLUGIN_PATH=$TMP/old IDIST_BACKEND=mpi timeout 60 "$EX/all_reduce" 2>&1)
  check "a plugin of another idist version is refused, naming both" \
    contains "$out" "libidist-backend-mpi.so was built for idist 0.0.1 (plugin ABI 0), this libidist is"
  # idist-run asks libidist (idist::plugin_status), so that --version and --dry-run call
  # unusable what init() refuses, in init()'s words.
  refusal=$(grep -o "backend 'mpi': .*install matching versions" <<<"$out" | head -1)
  version=$(IDIST_PLUGIN_PATH=$TMP/old "$RUN" --version 2>&1)
  check "--version: a plugin of another version is no backend" equals "$(head -1 <<<"$version" | grep -c mpi)" 0 ||
    echo "$version"
  check "--version: ... and says why in init()'s words ($refusal)" \
    bash -c '[ -n "$1" ] && grep -qxF "  mpi: $1" <<<"$2"' _ "$refusal" "$version" || echo "$version"
  plan=$(IDIST_PLUGIN_PATH=$TMP/old "$RUN" --dry-run --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --rdzv-id dry -n 1 /bin/true)
  check "--dry-run: a ucx plugin of another version is not taken between hosts, in init()'s words" \
    contains "$(jq -r .interhost.choice <<<"$plan")" \
    "gloo: this host cannot run ucx (backend 'ucx': $TMP/old/libidist-backend-ucx.so was built for idist 0.0.1 (plugin ABI 0)"
else
  check "g++ builds a stand-in plugin" false
  cat "$TMP/gcc.log"
fi

# --- the mpi plugin, found through IDIST_PLUGIN_PATH, and libmpi hidden ----------------------
if [ -e "$PLUGINS/libidist-backend-mpi.so" ] && command -v mpirun >/dev/null; then
  out=$(IDIST_PLUGIN_PATH=$PLUGINS timeout 60 mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH \
    -x IDIST_PLUGIN_PATH -np 2 "$RUN" --backend mpi "$EX/all_reduce" 2>&1)
  check "mpirun -np 2 --backend mpi loads the plugin from IDIST_PLUGIN_PATH" \
    contains "$out" "Rank 1, After performing all_reduce: [4, 6]" || echo "$out" | tail -5
  libmpi=$(readlink -f "$(ldd "$PLUGINS/libidist-backend-mpi.so" | awk '/libmpi\.so/ {print $3}')")
  if [ "$(id -u)" = 0 ] && [ -f "$libmpi" ] && unshare -m true 2>/dev/null; then
    # A private mount namespace where libmpi is an empty file: nothing outside it sees this.
    hide="mount --bind /dev/null '$libmpi' &&"
    out=$(unshare -m bash -c "$hide timeout 60 '$RUN' -n 3 '$EX/all_reduce'" 2>&1)
    check "with $libmpi hidden, a gloo program runs" contains "$out" "Rank 2, After performing all_reduce: [9, 12]"
    out=$(IDIST_PLUGIN_PATH=$PLUGINS IDIST_BACKEND=mpi unshare -m bash -c "$hide timeout 60 '$EX/all_reduce'" 2>&1)
    check "... and --backend mpi fails naming libmpi" \
      contains "$out" "backend 'mpi': cannot load $PLUGINS/libidist-backend-mpi.so: " &&
      contains "$out" "libmpi.so.40: file too short"
  else
    echo "# SKIP: hiding libmpi needs root and unshare -m"
  fi
else
  echo "# SKIP: the mpi plugin with mpirun: no mpi plugin built or no mpirun"
fi

finish
