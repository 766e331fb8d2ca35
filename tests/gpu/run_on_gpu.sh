#!/bin/bash
# The GPU run, in one go, on a bare machine with one NVIDIA GPU (tests/gpu/README.md):
#   the machine line; nccl_check (every op x dtype NCCL has, device and host buffers, a group of
#   one, device buffers refused by gloo and mpi); nccl_check --timeout (a collective that cannot
#   start times out, aborts the communicator and raises); idist-run -n 1 --backend nccl;
#   idist::torch's collectives on CUDA tensors and a CUDA training loop (torch_cuda_check, built
#   there against the machine's libtorch by build_torch_cuda.sh);
#   the reduction kernels at AVX-512 (test_reduce_isa forced, shm all_reduce at AVX2 and AVX-512);
#   idist-bench --backend nccl from 8 B to 1 GiB in device memory; and the reference beside it,
#   PyTorch's ProcessGroupNCCL on the same sizes (bench/torch_nccl_ref.py), with the GPU's
#   device-to-device copy bandwidth.
# Everything goes into OUT (at most 8 files). Each step is bounded by `timeout` and the next
# runs whatever the last one did; the exit status is 0 only when every step passed.
#
#   bash tests/gpu/bundle.sh                          # on the CPU machine: builds .gpu-bundle
#   bash tests/gpu/run_on_gpu.sh OUT [.gpu-bundle [checks]]   # on the GPU machine, from the repo root
# With `checks`, only the checks run (a minute less, for a second try at a fix); with `torch`,
# only idist::torch's (its build and torch_cuda_check).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: run_on_gpu.sh OUT [BUNDLE [checks]]}
bundle=$(realpath "${2:-.gpu-bundle}")
only_checks=$([[ ${3:-} == checks || ${3:-} == torch ]] && echo 1)
only_torch=$([[ ${3:-} == torch ]] && echo 1)
mkdir -p "$out"
log="$out/run.log"
: >"$log"
failed=()
started=$(date +%s)

say() { echo "run_on_gpu: $*" | tee -a "$log"; }

# step NAME LIMIT FILE CMD...: runs CMD with its output in FILE (appended), says how it ended.
step() {
  local name=$1 limit=$2 file=$3
  shift 3
  local t0=$(date +%s%N)
  echo "### $name: $*" >>"$file"
  timeout --kill-after=5 "$limit" "$@" >>"$file" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  local took=$(( ms / 1000 )).$(( ms % 1000 / 100 ))
  echo "### $name: exit $rc after ${took} s" >>"$file"
  case $rc in
    0) say "$name: ok (${took} s)" ;;
    77) say "$name: SKIPPED (${took} s): $(grep -m1 SKIPPED "$file")" ;;
    124|137) say "$name: TIMED OUT after $limit s"; failed+=("$name") ;;
    *) say "$name: FAILED, exit $rc (${took} s): $(tail -n 3 "$file" | tr '\n' ' ')"; failed+=("$name") ;;
  esac
}

# --- the machine --------------------------------------------------------------------------------
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(cat "$bundle/commit" 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,pcie.link.gen.max --format=csv 2>&1
  nvidia-smi -L 2>&1
  echo "kernel: $(uname -sr)"
  grep -m1 PRETTY_NAME /etc/os-release 2>/dev/null
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo "cpus: $(nproc), memory: $(free -g 2>/dev/null | awk '/Mem:/ {print $2 " GiB"}')"
  command -v nvcc >/dev/null && nvcc --version | tail -2
  python3 -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1
} >"$out/machine.txt"
say "machine: $(sed -n 2,3p "$out/machine.txt" | tr '\n' ' ')"

# --- libraries: the bundle's, the machine's NCCL and driver -------------------------------------
if [[ ! -x "$bundle/bin/nccl_check" ]]; then
  say "no bundle at $bundle: run tests/gpu/bundle.sh on a machine with the build's packages first"
  exit 1
fi
nccl=$(find /opt /usr/local /usr/lib /usr/lib64 -name 'libnccl.so.2*' -not -path "$bundle/*" 2>/dev/null | sort | head -1)
cuda_driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}')
[[ -n $cuda_driver ]] || cuda_driver=$(find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libcuda.so.1' 2>/dev/null | head -1)
say "NCCL: ${nccl:-not found}; CUDA driver library: ${cuda_driver:-not found}"
export LD_LIBRARY_PATH="$bundle/lib:$bundle/lib/deps${nccl:+:$(dirname "$nccl")}${cuda_driver:+:$(dirname "$cuda_driver")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NCCL's soname is libnccl.so.2; the wheel's file may carry a longer name.
if [[ -n $nccl && $(basename "$nccl") != libnccl.so.2 ]]; then
  ln -sf "$nccl" "$bundle/lib/deps/libnccl.so.2"
fi
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >>"$out/machine.txt"
# An older glibc than the build's: run through the carried loader and glibc.
run=()
built_with=$(cat "$bundle/glibc.version" 2>/dev/null || echo 2.36)
here=$(ldd --version 2>&1 | head -1 | grep -oE '[0-9]+\.[0-9]+$')
if [[ -n $here && $(printf '%s\n%s\n' "$built_with" "$here" | sort -V | head -1) != "$built_with" ]]; then
  run=("$bundle/glibc/ld-linux-x86-64.so.2" --library-path "$bundle/glibc:$LD_LIBRARY_PATH")
  say "this machine's glibc is older than the build's: running through the carried one"
fi
missing=$(for f in "$bundle"/bin/* "$bundle"/lib/*.so* "$bundle"/lib/idist/*.so; do ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|$(basename "$f"): |"; done | sort -u)
[[ -z $missing ]] || say "libraries not found: $(echo "$missing" | tr '\n' ';')"
echo "$missing" >>"$out/machine.txt"

# --- checks -------------------------------------------------------------------------------------
bin=$bundle/bin
if [[ -z $only_torch ]]; then
step nccl_check 240 "$out/nccl_check.txt" "${run[@]}" "$bin/nccl_check"
grep -E '^(nccl_check|FAIL)' "$out/nccl_check.txt" | head -20 | tee -a "$log"
# The stacks at 9 s, while finalize() runs after the timeout at 5 s: what it waits for, if anything.
step nccl_check_timeout 60 "$out/checks.txt" env IDIST_TIMEOUT=5 bash tests/gpu/stacks_at.sh 9 50 "${run[@]}" "$bin/nccl_check" --timeout
# The reduction kernels at AVX-512, which no CPU machine of ours has (issue 29): each variant
# against the scalar reference, then shared-memory all_reduce at AVX2 and at AVX-512 in turn.
if [[ -x $bin/test_reduce_isa ]]; then
  echo "### cpu flags: $(grep -m1 -owE 'avx2|avx512(f|bw|dq|vl)' /proc/cpuinfo | sort -u | tr '\n' ' ')" >>"$out/checks.txt"
  step kernels_avx512 60 "$out/checks.txt" env IDIST_REDUCE_ISA=avx512 "${run[@]}" "$bin/test_reduce_isa"
  for isa in avx2 avx512 avx2 avx512; do
    step "shm_all_reduce_$isa" 60 "$out/checks.txt" env IDIST_REDUCE_ISA=$isa IDIST_VERBOSE=1 "$bin/idist-run" -n 2 \
      "$bin/idist-bench" all_reduce -b 64K -e 16M -f 4 -t 0.1
  done
fi
# Open MPI's runtime (orted, its components, PMIx) is not carried: this needs the machine's own.
if command -v orted >/dev/null && ldconfig -p | grep -q 'libmpi\.so\.40 '; then
  step nccl_check_mpi 60 "$out/checks.txt" "${run[@]}" "$bin/nccl_check" --backend mpi
else
  say "nccl_check_mpi: SKIPPED: no Open MPI runtime on this machine (orted, libmpi.so.40)"
fi
if [[ ${#run[@]} -eq 0 ]]; then
  # The launcher's path: a rank of its own, the nccl backend chosen by --backend.
  step idist_run_nccl 120 "$out/checks.txt" "$bin/idist-run" -n 1 --backend nccl \
    "$bin/idist-bench" all_reduce broadcast -b 8 -e 64M -f 8 -t 0.05
fi
grep -E '^(ok|FAIL|nccl_check|     raised|     finalize)' "$out/checks.txt" | tee -a "$log"
fi

# --- idist::torch on CUDA tensors: built here, against this machine's libtorch (with CUDA) ---------
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step torch_cuda_build 300 "$out/torch_cuda.txt" bash tests/gpu/build_torch_cuda.sh "$bundle" /tmp/idist-torch-cuda
  step torch_cuda_check 120 "$out/torch_cuda.txt" bash tests/gpu/stacks_at.sh 45 90 "${run[@]}" /tmp/idist-torch-cuda/torch_cuda_check
  grep -E '^(ok|FAIL|torch_cuda_check|build_torch_cuda|stacks_at|     loss)' "$out/torch_cuda.txt" | tee -a "$log"
else
  say "torch_cuda: SKIPPED: no python3 torch with CUDA here"
fi

# --- benchmarks: idist, then torch beside it ----------------------------------------------------
if [[ -n $only_checks ]]; then
  say "done in $(( $(date +%s) - started )) s (checks only); ${#failed[@]} step(s) failed${failed[*]:+: ${failed[*]}}"
  [[ ${#failed[@]} -eq 0 ]]
  exit
fi
sweep=(-b 8 -e 1G -f 2 -t 0.2)
# The table, not --json: its rows come as they are measured, so a run cut short keeps them.
step idist_bench 300 "$out/bench_idist.txt" "${run[@]}" "$bin/idist-bench" --backend nccl "${sweep[@]}"
if python3 -c 'import torch' 2>/dev/null; then
  step torch_nccl_ref 300 "$out/bench_torch.txt" env PYTHONUNBUFFERED=1 python3 bench/torch_nccl_ref.py \
    "${sweep[@]}" --json "$out/bench_torch.json"
else
  say "torch_nccl_ref: SKIPPED: no python3 with torch here"
fi

say "done in $(( $(date +%s) - started )) s; ${#failed[@]} step(s) failed${failed[*]:+: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]
