// The nccl backend on a GPU: every collective x every dtype NCCL reduces, on device buffers
// (cudaMalloc) and on host buffers (staged through the GPU), for 1, 7, 1000 and 0 elements,
// against closed-form values; then the bitwise ops' clear refusal, barrier, ibarrier,
// new_group({0}), iall_reduce + wait(), and the host-side string helpers. One line per case,
// then "nccl_check: N checks, M failed" (exit 0 when none failed, 1 otherwise). Without a
// GPU: "nccl_check: SKIPPED: <reason>" and exit 77.
//
// `nccl_check --timeout` checks the one path a world of one cannot reach by waiting for a
// peer: a collective whose work cannot start (a host function holds the default stream, which
// the backend's stream follows) times out after IDIST_TIMEOUT, aborts the communicator and
// raises TimeoutError, promptly; the next call says the communicator was aborted; finalize()
// returns. `nccl_check --backend mpi` only checks that the mpi backend refuses a device
// buffer (a world of one is MPI's singleton).
//
// Written for a world of one (our GPU machine has one GPU, and NCCL refuses two ranks on one
// GPU); the expected values are closed forms in the world size, so on a machine with several
// GPUs it also runs as `idist-run -n <GPUs> --backend nccl ./nccl_check`.
//
// Build standalone, from the repository root, against the libidist of a build with NCCL
// (`cmake -S . -B build && cmake --build build` prints "idist: nccl backend: built"):
//
//   g++ -std=c++20 -O2 -Wall -Wextra -Wpedantic tests/gpu/nccl_check.cpp -o nccl_check -I lib/include -L build/lib -lidist -Wl,-rpath,$PWD/build/lib -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,/usr/local/cuda/lib64
//   ./nccl_check

#include <cuda_runtime.h>
#include <idist/idist.hpp>

#include "../check_cases.hpp"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using idist::ReduceOp;

using check_cases::run_case;
int rank = 0;
int world = 1;

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// --- element values: every one a small integer, exact in all eight dtypes ---------------------

template <class T>
T make(double value) {
  if constexpr (std::is_same_v<T, idist::float16> || std::is_same_v<T, idist::bfloat16>) {
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

template <class T>
double value_of(T x) {
  if constexpr (std::is_same_v<T, idist::float16> || std::is_same_v<T, idist::bfloat16>) {
    return static_cast<double>(static_cast<float>(x));
  } else {
    return static_cast<double>(x);
  }
}

// What rank r holds at index i for a reduction with `op`: products stay within int8.
double input(ReduceOp op, int r, std::size_t i) {
  if (op == ReduceOp::PRODUCT) return 1.0 + static_cast<double>((i + static_cast<std::size_t>(r)) % 2);
  return static_cast<double>(i % 7) + r;
}

// The reduction over ranks 0..world-1 of input(op, r, i), in closed form.
double reduced(ReduceOp op, std::size_t i) {
  const double n = world;
  switch (op) {
    case ReduceOp::SUM: return n * static_cast<double>(i % 7) + n * (n - 1) / 2;
    case ReduceOp::MIN: return static_cast<double>(i % 7);
    case ReduceOp::MAX: return static_cast<double>(i % 7) + n - 1;
    case ReduceOp::PRODUCT: {
      // A factor 2 from every rank r with i + r odd.
      const int twos = i % 2 == 0 ? world / 2 : (world + 1) / 2;
      return std::pow(2.0, twos);
    }
    default: return std::nan("");
  }
}

// What rank r contributes at index i to gathers, scatters and broadcasts.
double block_value(int r, std::size_t i) { return static_cast<double>(i % 5) + 10.0 * r; }

template <class T>
std::vector<T> values(std::size_t count, const std::function<double(std::size_t)>& f) {
  std::vector<T> out;
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) out.push_back(make<T>(f(i)));
  return out;
}

template <class T>
std::string compare(const std::vector<T>& got, std::size_t count, const std::function<double(std::size_t)>& want) {
  if (got.size() != count)
    return "got " + std::to_string(got.size()) + " elements, want " + std::to_string(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (value_of(got[i]) != want(i)) {
      std::ostringstream out;
      out << "at [" << i << "] got " << value_of(got[i]) << ", want " << want(i);
      return out.str();
    }
  }
  return "";
}

// --- buffers in either memory ------------------------------------------------------------------

enum class Memory { device, host };

const char* name(Memory memory) { return memory == Memory::device ? "device" : "host"; }

template <class T>
class Buffer {
 public:
  Buffer(Memory memory, std::size_t count) : memory_(memory), count_(count) {
    if (memory_ == Memory::host) {
      host_.resize(count);
    } else if (count > 0) {
      void* p = nullptr;
      check_cuda(cudaMalloc(&p, count * sizeof(T)), "cudaMalloc");
      device_ = static_cast<T*>(p);
    }
  }
  ~Buffer() {
    if (device_ != nullptr) cudaFree(device_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  std::span<T> span() { return memory_ == Memory::device ? std::span<T>(device_, count_) : std::span<T>(host_); }

  void upload(const std::vector<T>& data) {
    if (memory_ == Memory::host) {
      host_ = data;
    } else if (count_ > 0) {
      check_cuda(cudaMemcpy(device_, data.data(), count_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
    }
  }

  std::vector<T> download() const {
    if (memory_ == Memory::host) return host_;
    std::vector<T> out(count_);
    if (count_ > 0)
      check_cuda(cudaMemcpy(out.data(), device_, count_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return out;
  }

 private:
  Memory memory_;
  std::size_t count_;
  std::vector<T> host_;
  T* device_ = nullptr;
};

// --- the grid ----------------------------------------------------------------------------------

constexpr ReduceOp kReduceOps[] = {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX};
constexpr std::size_t kCounts[] = {1, 7, 1000, 0};

template <class T>
void check_dtype() {
  const std::string dtype(idist::to_string(idist::dtype_of<T>));
  const int last = world - 1;  // root of the rooted collectives
  const auto n = static_cast<std::size_t>(world);
  const auto r = static_cast<std::size_t>(rank);

  for (const Memory memory : {Memory::device, Memory::host}) {
    for (const std::size_t count : kCounts) {
      const std::string where = " " + dtype + " " + name(memory) + " count=" + std::to_string(count);

      for (const ReduceOp op : kReduceOps) {
        const std::string how = std::string(idist::to_string(op));
        run_case("all_reduce " + how + where, [&] {
          Buffer<T> data(memory, count);
          data.upload(values<T>(count, [&](std::size_t i) { return input(op, rank, i); }));
          idist::all_reduce(data.span(), op);
          return compare(data.download(), count, [&](std::size_t i) { return reduced(op, i); });
        });
        run_case("reduce " + how + " dst=" + std::to_string(last) + where, [&] {
          Buffer<T> data(memory, count);
          data.upload(values<T>(count, [&](std::size_t i) { return input(op, rank, i); }));
          idist::reduce(data.span(), {.dst = last, .op = op});
          // The other ranks get their input back.
          return compare(data.download(), count,
                         [&](std::size_t i) { return rank == last ? reduced(op, i) : input(op, rank, i); });
        });
        run_case("reduce_scatter " + how + where, [&] {
          Buffer<T> in(memory, n * count);
          Buffer<T> out(memory, count);
          in.upload(values<T>(n * count, [&](std::size_t j) { return input(op, rank, j); }));
          idist::reduce_scatter(std::span<const T>(in.span()), out.span(), {.op = op});
          return compare(out.download(), count, [&](std::size_t k) { return reduced(op, r * count + k); });
        });
      }

      // Block q of a gathered output is rank q's contribution.
      const auto gathered = [&](std::size_t j) { return block_value(static_cast<int>(j / count), j % count); };
      run_case("all_gather" + where, [&] {
        Buffer<T> in(memory, count);
        in.upload(values<T>(count, [&](std::size_t i) { return block_value(rank, i); }));
        return compare(idist::all_gather(std::span<const T>(in.span())), n * count, gathered);
      });
      run_case("iall_gather" + where, [&] {
        Buffer<T> in(memory, count);
        Buffer<T> out(memory, n * count);
        in.upload(values<T>(count, [&](std::size_t i) { return block_value(rank, i); }));
        idist::iall_gather(std::span<const T>(in.span()), out.span()).wait();
        return compare(out.download(), n * count, gathered);
      });
      run_case("gather dst=" + std::to_string(last) + where, [&] {
        Buffer<T> in(memory, count);
        in.upload(values<T>(count, [&](std::size_t i) { return block_value(rank, i); }));
        const auto got = idist::gather(std::span<const T>(in.span()), {.dst = last});
        if (rank != last) return got.empty() ? std::string() : std::string("a non-dst rank received data");
        return compare(got, n * count, gathered);
      });
      run_case("scatter src=" + std::to_string(last) + where, [&] {
        Buffer<T> in(memory, rank == last ? n * count : 0);
        Buffer<T> out(memory, count);
        if (rank == last) in.upload(values<T>(n * count, gathered));
        idist::scatter(std::span<const T>(in.span()), out.span(), {.src = last});
        return compare(out.download(), count, [&](std::size_t i) { return block_value(rank, i); });
      });
      run_case("broadcast src=" + std::to_string(last) + where, [&] {
        Buffer<T> data(memory, count);
        data.upload(values<T>(count, [&](std::size_t i) { return rank == last ? block_value(last, i) : 99.0; }));
        idist::broadcast(data.span(), last);
        return compare(data.download(), count, [&](std::size_t i) { return block_value(last, i); });
      });
      run_case("iall_reduce SUM + wait()" + where, [&] {
        Buffer<T> data(memory, count);
        data.upload(values<T>(count, [&](std::size_t i) { return input(ReduceOp::SUM, rank, i); }));
        idist::iall_reduce(data.span()).wait();
        return compare(data.download(), count, [&](std::size_t i) { return reduced(ReduceOp::SUM, i); });
      });
    }
  }
}

// AVG (ncclAvg) on the floating dtypes: the sum over ranks divided by their number.
template <class T>
void check_average() {
  const std::string dtype(idist::to_string(idist::dtype_of<T>));
  for (const Memory memory : {Memory::device, Memory::host}) {
    run_case("all_reduce AVG " + dtype + " " + name(memory) + " count=1000", [&] {
      Buffer<T> data(memory, 1000);
      data.upload(values<T>(1000, [&](std::size_t i) { return input(ReduceOp::SUM, rank, i); }));
      idist::all_reduce(data.span(), ReduceOp::AVG);
      const auto got = data.download();
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double want = reduced(ReduceOp::SUM, i) / world;
        if (std::abs(value_of(got[i]) - want) > 1e-2 * std::max(1.0, want))
          return "at [" + std::to_string(i) + "] got " + std::to_string(value_of(got[i])) + ", want " + std::to_string(want);
      }
      return std::string();
    });
  }
}

// NCCL has no bitwise reductions: a clear error naming backend and op, and the communicator
// stays usable (the next case reduces on it).
template <class T>
void check_bitwise_refused() {
  const std::string dtype(idist::to_string(idist::dtype_of<T>));
  for (const Memory memory : {Memory::device, Memory::host}) {
    for (const ReduceOp op : {ReduceOp::AND, ReduceOp::OR, ReduceOp::XOR}) {
      const std::string how(idist::to_string(op));
      run_case("all_reduce " + how + " " + dtype + " " + name(memory) + " is refused", [&]() -> std::string {
        Buffer<T> data(memory, 7);
        data.upload(values<T>(7, [](std::size_t i) { return static_cast<double>(i); }));
        try {
          idist::all_reduce(data.span(), op);
        } catch (const idist::Error& e) {
          const std::string text = e.what();
          if (text.find("nccl") == std::string::npos || text.find(how) == std::string::npos)
            return "the error does not name nccl and " + how + ": " + text;
          std::vector<T> after = values<T>(7, [](std::size_t i) { return static_cast<double>(i); });
          idist::all_reduce(std::span<T>(after));
          return compare(after, 7, [](std::size_t i) { return static_cast<double>(world) * static_cast<double>(i); });
        }
        return "no error";
      });
    }
  }
}

void check_the_rest() {
  run_case("barrier", [] {
    idist::barrier();
    return std::string();
  });
  run_case("ibarrier + wait()", [] {
    idist::ibarrier().wait();
    return std::string();
  });
  run_case("new_group({0}): a group of one, all_reduce and barrier on it (device buffer)", [] {
    const auto group = idist::new_group({0});
    const bool member = rank == 0;
    if (group.is_member() != member || group.rank() != (member ? 0 : -1) || group.size() != 1)
      return std::string("wrong membership, rank or size");
    Buffer<float> data(Memory::device, 7);
    data.upload(values<float>(7, [](std::size_t i) { return static_cast<double>(i) + rank; }));
    idist::all_reduce(data.span(), {.op = ReduceOp::SUM, .group = group});
    idist::barrier({.group = group});
    // One member: its own values; a non-member gets its input back.
    return compare(data.download(), 7, [](std::size_t i) { return static_cast<double>(i) + rank; });
  });
  run_case("broadcast safe_mode (device buffer)", [] {
    const int last = world - 1;
    Buffer<std::int64_t> data(Memory::device, 5);
    data.upload(values<std::int64_t>(5, [&](std::size_t i) { return rank == last ? block_value(last, i) : 0.0; }));
    idist::broadcast(data.span(), {.src = last, .safe_mode = true});
    return compare(data.download(), 5, [&](std::size_t i) { return block_value(last, i); });
  });
  run_case("all_gather(std::string) and broadcast(std::string) (host, staged)", [] {
    const auto names = idist::all_gather("rank-" + std::to_string(rank));
    for (int q = 0; q < world; ++q)
      if (names.at(static_cast<std::size_t>(q)) != "rank-" + std::to_string(q)) return "all_gather: " + names[static_cast<std::size_t>(q)];
    const auto hello = idist::broadcast(rank == 0 ? std::string("hello from 0") : std::string(), 0);
    return hello == "hello from 0" ? std::string() : "broadcast: " + hello;
  });
}

// A backend without device buffers refuses GPU memory with a clear error, before reading it.
std::string device_buffer_refused() {
  float* device = nullptr;
  check_cuda(cudaMalloc(&device, 4 * sizeof(float)), "cudaMalloc");
  std::string why = "no error";
  try {
    idist::all_reduce(std::span<float>(device, 4));
  } catch (const idist::Error& e) {
    why = std::string(e.what()).find("GPU memory") != std::string::npos ? "" : e.what();
  }
  cudaFree(device);
  return why;
}

int finish() { return check_cases::finish("nccl_check"); }

// Holds the legacy default stream for `seconds`: the backend's stream waits for it before
// every operation, so nothing the next collective queues can run until then.
void CUDART_CB hold_stream(void* seconds) {
  std::this_thread::sleep_for(std::chrono::seconds(*static_cast<int*>(seconds)));
}

int check_timeout() {
  // IDIST_TIMEOUT is the script's (2 s); the stream is held far longer.
  static int held_seconds = 20;
  idist::init({.backend = "nccl"});
  std::printf("nccl_check --timeout: IDIST_TIMEOUT=%s, default stream held %d s\n",
              std::getenv("IDIST_TIMEOUT") != nullptr ? std::getenv("IDIST_TIMEOUT") : "(unset)", held_seconds);
  Buffer<float> data(Memory::device, 1000);
  data.upload(values<float>(1000, [](std::size_t i) { return static_cast<double>(i); }));
  check_cuda(cudaLaunchHostFunc(cudaStreamLegacy, hold_stream, &held_seconds), "cudaLaunchHostFunc");
  run_case("a collective that cannot start raises TimeoutError within IDIST_TIMEOUT + 3 s", [&]() -> std::string {
    const auto start = std::chrono::steady_clock::now();
    try {
      idist::all_reduce(data.span());
    } catch (const idist::TimeoutError& e) {
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("     raised after %.1f s: %s\n", took, e.what());
      if (std::string(e.what()).find("aborted") == std::string::npos) return "the error does not say the communicator was aborted";
      const char* limit = std::getenv("IDIST_TIMEOUT");
      if (took > (limit != nullptr ? std::atof(limit) : 300.0) + 3.0) return "raised only after " + std::to_string(took) + " s";
      return "";
    } catch (const std::exception& e) {
      return std::string("not a TimeoutError: ") + e.what();
    }
    return "no error";
  });
  run_case("the next call says the communicator is unusable, at once", [&]() -> std::string {
    const auto start = std::chrono::steady_clock::now();
    try {
      idist::all_reduce(data.span());
    } catch (const idist::Error& e) {
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("     raised after %.3f s: %s\n", took, e.what());
      return took < 1.0 ? "" : "took " + std::to_string(took) + " s";
    }
    return "no error";
  });
  run_case("finalize() returns within IDIST_TIMEOUT + 3 s after the abort", [] {
    const auto start = std::chrono::steady_clock::now();
    idist::finalize();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("     finalize() took %.1f s\n", took);
    const char* limit = std::getenv("IDIST_TIMEOUT");
    return took <= (limit != nullptr ? std::atof(limit) : 300.0) + 3.0 ? std::string() : "took " + std::to_string(took) + " s";
  });
  // Exits without waiting for the held stream (the process's end releases it).
  std::_Exit(finish());  // finish() flushed
}

int check_mpi_refusal() {
  try {
    idist::init({.backend = "mpi"});
  } catch (const std::exception& e) {
    std::printf("nccl_check --backend mpi: SKIPPED: the mpi backend cannot start here: %s\n", e.what());
    return 77;
  }
  run_case("mpi refuses a device buffer", device_buffer_refused);
  idist::finalize();
  return finish();
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (const auto status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0) {
    std::printf("nccl_check: SKIPPED: no CUDA device is visible (cudaGetDeviceCount: %s)\n",
                status != cudaSuccess ? cudaGetErrorString(status) : "0 devices");
    return 77;
  }
  const std::string_view mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "--timeout") return check_timeout();
    if (mode == "--backend" && argc > 2 && std::string_view(argv[2]) == "mpi") return check_mpi_refusal();
  } catch (const std::exception& e) {
    std::printf("nccl_check %s: %s\n", argv[1], e.what());
    return 1;
  }
  if (!mode.empty()) {
    std::fprintf(stderr, "nccl_check: unknown argument '%s' (none, --timeout or --backend mpi)\n", argv[1]);
    return 2;
  }
  try {
    idist::init({.backend = "nccl"});
  } catch (const std::exception& e) {
    std::printf("nccl_check: init failed: %s\nnccl_check: 1 checks, 1 failed\n", e.what());
    return 1;
  }
  rank = idist::get_rank();
  world = idist::get_world_size();
  std::printf("nccl_check: rank %d of %d, backend %s, %d visible GPU(s)\n", rank, world, idist::backend().c_str(), devices);
  run_case("backend is nccl", [] { return idist::backend() == "nccl" ? std::string() : "backend " + idist::backend(); });

  check_dtype<std::int8_t>();
  check_dtype<std::uint8_t>();
  check_dtype<std::int32_t>();
  check_dtype<std::int64_t>();
  check_dtype<idist::float16>();
  check_dtype<idist::bfloat16>();
  check_dtype<float>();
  check_dtype<double>();
  check_average<idist::float16>();
  check_average<idist::bfloat16>();
  check_average<float>();
  check_average<double>();
  check_bitwise_refused<std::int8_t>();
  check_bitwise_refused<std::uint8_t>();
  check_bitwise_refused<std::int32_t>();
  check_bitwise_refused<std::int64_t>();
  check_the_rest();

  try {
    idist::finalize();
  } catch (const std::exception& e) {
    check_cases::fail(std::string("finalize: ") + e.what());
  }
  // The same device buffer handed to gloo: refused with a clear error, not read as host memory.
  run_case("gloo refuses a device buffer", [] {
    idist::init({.backend = "gloo"});
    const auto why = device_buffer_refused();
    idist::finalize();
    return why;
  });
  return finish();
}
