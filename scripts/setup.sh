#!/bin/bash
# Installs the Debian 12 packages the build needs (only those missing), then configures and
# builds everything into build/. Run as root, or as a user with sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  g++ cmake make pkg-config          # toolchain
  libgloo-dev                        # the gloo backend
  libcli11-dev libspdlog-dev nlohmann-json3-dev libboost1.81-dev  # CLI, logging, JSON, Asio
  libssl-dev                         # TLS to etcd (the etcd rendezvous' https and client certificates)
  doctest-dev                        # unit tests
  procps                             # pgrep/pkill, used by the end-to-end tests
  slurm-client slurmctld slurmd munge  # a real local SLURM for the detection tests (scripts/slurm-local.sh)
  openmpi-bin libopenmpi-dev         # a real mpirun for the detection tests; the mpi backend
  mpich                              # MPICH's Hydra (mpiexec.hydra) beside Open MPI, for e2e.hydra; Open MPI stays the default
  iproute2 jq                        # network namespaces for two-host tests; reading --dry-run's JSON
  clang libclang-rt-14-dev           # libFuzzer, ASan and UBSan for tests/fuzz (fuzz.all)
  help2man                           # idist-run's man page, made from its --help
  dpkg-dev                           # dpkg-shlibdeps: the Depends of the .deb packages (cpack, e2e.deb)
  python3-torch                      # PyTorch scripts under idist-run, unchanged (e2e.torch); Python DDP, the reference of bench/ddp
  libtorch-dev                       # idist::torch (torch/): auto_model, auto_dataloader, tensor collectives
  libopenblas0-openmp                # torch's BLAS: Debian's default is the reference one, 20x slower on bench/ddp's MLP
  libucx-dev ucx-utils               # the ucx backend between hosts (issue 29); ucx_info/ucx_perftest for its checks
  etcd-server etcd-client            # real etcd members for the etcd rendezvous tests (issue 30)
  prometheus python3-prometheus-client  # a real Prometheus and its parser scraping --metrics (e2e.metrics)
  openssl                            # a CA and certificates for the etcd-over-TLS test
)

source scripts/install_missing.sh
install_missing setup "${PACKAGES[@]}"

# The mpi and ucx backends and idist::torch are required here (their packages are installed
# above), so CI tests them rather than quietly building without one.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDIST_WITH_MPI=ON -DIDIST_WITH_UCX=ON -DIDIST_WITH_TORCH=ON \
  >/dev/null
cmake --build build -j "$(nproc)"
