#!/bin/bash
# Builds libidist-torch and tests/gpu/torch_cuda_check against the libtorch of a Python's torch
# (on the GPU machine, PyTorch's wheel, which has CUDA; Debian's libtorch-dev has none) and the
# bundle's libidist. Plain g++ lines, run in parallel: the GPU machine has no CMake package of
# ours and no time to spare.
#   bash tests/gpu/build_torch_cuda.sh BUNDLE OUT_DIR [PYTHON]      -> OUT_DIR/torch_cuda_check
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=$(realpath "$1")
out=$(mkdir -p "$2" && realpath "$2")
python=${3:-python3}
read -r tdir abi version < <("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__), int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__)')
echo "build_torch_cuda: torch $version at $tdir (C++11 ABI: $abi)"
[ "$abi" = 1 ] || { echo "build_torch_cuda: this torch uses the old C++ ABI; libidist uses the new one" >&2; exit 1; }
flags=(-std=c++20 -O1 -fPIC -D_GLIBCXX_USE_CXX11_ABI=1 -Ilib/include -Itorch/include -Itorch/src
       -isystem "$tdir/include" -isystem "$tdir/include/torch/csrc/api/include")
# --no-as-needed: libtorch_cuda registers CUDA from its static initialisers, which a linker that
# drops unreferenced libraries (Ubuntu's default) would leave out.
libs=(-L"$bundle/lib" -lidist -Wl,--no-as-needed -L"$tdir/lib" -ltorch -ltorch_cpu -lc10)
for cuda_lib in torch_cuda c10_cuda; do
  [ -e "$tdir/lib/lib$cuda_lib.so" ] && libs+=(-l$cuda_lib)
done
libs+=(-Wl,--as-needed -Wl,-rpath,"$tdir/lib")
pids=()
for src in torch/src/*.cpp tests/gpu/torch_cuda_check.cpp; do
  g++ "${flags[@]}" -c "$src" -o "$out/$(basename "$src" .cpp).o" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
objects=()
for src in torch/src/*.cpp; do objects+=("$out/$(basename "$src" .cpp).o"); done
g++ -shared -o "$out/libidist-torch.so" "${objects[@]}" "${libs[@]}"
g++ -o "$out/torch_cuda_check" "$out/torch_cuda_check.o" -L"$out" -lidist-torch "${libs[@]}" -Wl,-rpath,"$out"
echo "build_torch_cuda: $out/torch_cuda_check"
