// idist-bench: nccl-tests for libidist. Times all_reduce, all_gather, broadcast,
// reduce_scatter, reduce, barrier and send/recv over a sweep of sizes, checks every element
// of every result, and prints nccl-tests' columns (or --json). Runs on every backend:
//
//   idist-run -n 2 idist-bench -b 8 -e 64M -f 4                     # gloo
//   mpirun -np 2 idist-bench --backend mpi all_reduce               # mpi
//   idist-bench --backend nccl                                      # nccl, one GPU: device buffers
//
// It uses the public API only; the measuring is harness.hpp's, shared with the raw Gloo and
// MPI references in bench/, so the three can be compared line by line.
#include <idist/env_contract.hpp>
#include <idist/idist.hpp>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>

#include "harness.hpp"

#ifdef IDIST_BENCH_CUDA
#include <cuda_runtime.h>
#endif

namespace bench = idist::bench;
using bench::Collective;
using idist::DType;
using idist::ReduceOp;

namespace {

// The communicator the harness drives: idist's public API, nothing else.
class IdistComm {
 public:
  int rank() const { return idist::get_rank(); }
  int size() const { return idist::get_world_size(); }

  std::optional<std::string> unsupported(Collective, DType, std::optional<ReduceOp> op) const {
    if (idist::backend() == "nccl" && op && idist::is_bitwise(*op)) return "NCCL has no bitwise reductions";
    return std::nullopt;
  }

  template <class T>
  void all_reduce(T* data, std::size_t count, ReduceOp op) {
    idist::all_reduce(std::span<T>(data, count), idist::AllReduceOptions{.op = op});
  }
  template <class T>
  void reduce(T* data, std::size_t count, ReduceOp op, int root) {
    idist::reduce(std::span<T>(data, count), idist::ReduceOptions{.dst = root, .op = op});
  }
  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t block, ReduceOp op) {
    idist::reduce_scatter(std::span<const T>(in, block * static_cast<std::size_t>(size())), std::span<T>(out, block),
                          idist::AllReduceOptions{.op = op});
  }
  template <class T>
  void all_gather(const T* in, T* out, std::size_t block) {
    idist::all_gather(std::span<const T>(in, block), std::span<T>(out, block * static_cast<std::size_t>(size())));
  }
  template <class T>
  void broadcast(T* data, std::size_t count, int root) {
    idist::broadcast(std::span<T>(data, count), idist::BroadcastOptions{.src = root});
  }
  void barrier() { idist::barrier(); }
  template <class T>
  void send(const T* data, std::size_t count, int peer) {
    idist::send(std::span<const T>(data, count), peer);
  }
  template <class T>
  void recv(T* data, std::size_t count, int peer) {
    idist::recv(std::span<T>(data, count), peer);
  }
  std::vector<double> all_gather_doubles(std::span<const double> mine) { return idist::all_gather(mine); }
};

#ifdef IDIST_BENCH_CUDA
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Buffers in GPU memory, which the nccl backend uses in place (host buffers it would stage
// through the GPU, and time the copies too).
class DeviceMemory final : public bench::Memory {
 public:
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
    return p;
  }
  void release(void* p) override { cudaFree(p); }
  void upload(void* dst, const void* host, std::size_t bytes) override {
    check_cuda(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void download(void* host, const void* src, std::size_t bytes) override {
    check_cuda(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  void fill(void* dst, unsigned char byte, std::size_t bytes) override {
    check_cuda(cudaMemset(dst, byte, bytes), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  // cudaMemcpy returns before a device-to-device copy ends: synchronised, so that the copy is
  // not timed as part of the next call.
  void copy(void* dst, const void* src, std::size_t bytes) override {
    check_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  bench::Options options;
  std::string backend = "gloo";
  std::string memory = "auto";
  CLI::App app("nccl-tests style benchmark of libidist's collectives, with a check of every result", "idist-bench");
  app.add_option("--backend", backend, idist::env::backend_choices() + " (IDIST_BACKEND, set by idist-run --backend, wins)")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(idist::env::kBackendNames), std::end(idist::env::kBackendNames))))
      ->capture_default_str();
  app.add_option("--memory", memory,
                 "Where the buffers live: host, device (GPU memory, nccl only), or auto (device for nccl where this "
                 "build has CUDA, else host)")
      ->check(CLI::IsMember({"auto", "host", "device"}))
      ->capture_default_str();
  bench::CommandLine command_line(app, options);
  if (auto code = command_line.parse(argc, argv)) return *code;
#ifndef IDIST_BENCH_CUDA
  if (memory == "device") return bench::usage_error("idist-bench", "--memory device: this build has no CUDA");
#endif

  try {
    idist::init({.backend = backend});
    if (options.root >= idist::get_world_size()) {
      const int code = bench::usage_error(
          "idist-bench", "--root " + std::to_string(options.root) + " is not a rank (world size " +
                             std::to_string(idist::get_world_size()) + ")");
      idist::finalize();
      return code;
    }
    bench::HostMemory host;
#ifdef IDIST_BENCH_CUDA
    DeviceMemory device;
    const bool on_device = memory == "device" || (memory == "auto" && idist::backend() == "nccl");
    if (on_device && idist::backend() != "nccl") {
      idist::finalize();
      return bench::usage_error("idist-bench", "--memory device needs the nccl backend");
    }
    bench::Memory& buffers = on_device ? static_cast<bench::Memory&>(device) : host;
#else
    const bool on_device = false;
    bench::Memory& buffers = host;
#endif
    IdistComm comm;
    bench::Report report({"idist-bench", "idist", idist::backend(), on_device ? "device" : "host"}, options,
                         comm.rank(), comm.size());
    report.start();
    bench::Runner<IdistComm>(comm, buffers, options, report).run();
    const int code = report.finish();
    idist::finalize();
    return code;
  } catch (const std::bad_alloc&) {
    // parse() refused sweeps that cannot fit; memory taken by others since can still run out.
    std::fprintf(stderr, "idist-bench: out of memory for the benchmark's buffers; lower -e (--max-bytes)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "idist-bench: %s\n", e.what());
    return 1;
  }
}
