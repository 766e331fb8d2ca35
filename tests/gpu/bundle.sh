#!/bin/bash
# Makes the folder that tests/gpu/run_on_gpu.sh runs on the GPU machine, from a build here.
#
# Why not build there: the GPU machine has CUDA, NCCL (PyTorch's) and a compiler, but none of
# Debian's -dev packages the project needs (Gloo, Boost, CLI11, spdlog, nlohmann-json) and no
# package registry. Our CPU machines have the same CUDA major (13) and NCCL's headers, so the
# nccl plugin builds here like everything else; the bundle carries the binaries and every
# shared library they need (the CUDA runtime too, 0.7 MiB) except glibc, libstdc++, the CUDA
# driver and NCCL: NCCL is 208 MiB, too big to carry, and the GPU machine has its own (NCCL
# keeps its ABI within 2.x). glibc is carried in glibc/, used only where the machine's own is
# older than ours.
#
#   bash tests/gpu/bundle.sh [BUILD_DIR [BUNDLE_DIR]]     # defaults: build, .gpu-bundle
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
bundle=${2:-.gpu-bundle}

[[ -e "$build/lib/idist/libidist-backend-nccl.so" ]] || {
  echo "bundle.sh: $build has no nccl plugin ($build/lib/idist/libidist-backend-nccl.so): configure with -DIDIST_WITH_NCCL=ON where CUDA and NCCL are" >&2
  exit 1
}
cmake --build "$build" -j "$(nproc)" --target nccl_check idist-bench idist-run test_reduce_isa >/dev/null

rm -rf "$bundle"
# Stripped: the RelWithDebInfo build's debug information is most of its 115 MiB, and the
# device tool carries 64 MiB at most.
cmake --install "$build" --prefix "$bundle" --strip >/dev/null
rm -rf "$bundle/include" "$bundle/share" "$bundle/lib/cmake" "$bundle/lib/pkgconfig"
# idist::torch is built on the GPU machine against its own libtorch (build_torch_cuda.sh):
# Debian's has no CUDA, and would bring 460 MiB of libraries.
rm -f "$bundle"/lib/libidist-torch.so*
# Build-tree binaries: run_on_gpu.sh's LD_LIBRARY_PATH points them at the bundle's libidist.
# test_reduce_isa: the AVX-512 kernels, which no CPU machine of ours can run (issue 29).
for binary in tests/nccl_check apps/idist-bench/idist-bench tests/test_reduce_isa; do
  strip -o "$bundle/bin/$(basename "$binary")" "$build/$binary"
done
# The libraries a stack taken on the GPU machine goes through keep their symbols (not their
# debug information), so that tests/gpu/stacks_at.sh names our functions.
strip --strip-debug -o "$bundle/lib/libidist.so.$(cd "$build/lib" && ls libidist.so.*.*.* | sed 's/libidist.so.//')" \
  "$(ls "$build"/lib/libidist.so.*.*.*)"
strip --strip-debug -o "$bundle/lib/idist/libidist-backend-nccl.so" "$build/lib/idist/libidist-backend-nccl.so"
strip --strip-debug -o "$bundle/bin/nccl_check" "$build/tests/nccl_check"

# Every library the binaries and plugins load, but the ones the GPU machine has of its own.
keep_system='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl\.so|libnvidia)'
mkdir -p "$bundle/lib/deps" "$bundle/glibc"
mapfile -t objects < <(find "$bundle/bin" "$bundle/lib" -type f \( -perm -u+x -o -name '*.so*' \) | sort)
for object in "${objects[@]}"; do
  LD_LIBRARY_PATH="$bundle/lib:$bundle/lib/deps" ldd "$object" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  case "$path" in "$bundle"/*|"$PWD/$bundle"/*) continue ;; esac
  if [[ $name =~ $keep_system ]]; then
    # glibc's family, carried apart for a machine whose glibc is older than ours.
    [[ $name =~ ^(ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s) ]] && cp -L "$path" "$bundle/glibc/$name"
    continue
  fi
  cp -L "$path" "$bundle/lib/deps/$name"
done
cp -L /lib64/ld-linux-x86-64.so.2 "$bundle/glibc/"
{ git rev-parse --short HEAD; git status --porcelain | grep -q . && echo "(with uncommitted changes)"; } 2>/dev/null |
  tr '\n' ' ' >"$bundle/commit" || true
ldd --version | head -1 | grep -oE '[0-9]+\.[0-9]+$' >"$bundle/glibc.version"
echo "bundle.sh: $bundle: $(du -sh "$bundle" | cut -f1), $(ls "$bundle/lib/deps" | wc -l) libraries carried"
