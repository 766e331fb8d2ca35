// raw_mpi: the reference for idist over MPI. MPI called directly, as an MPI program would:
// the blocking collectives on MPI_COMM_WORLD (MPI_Allreduce and MPI_Reduce in place,
// MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast, MPI_Barrier), MPI_Send/MPI_Recv. It
// takes idist-bench's options and prints its columns (the harness is shared), so
//   mpirun -np 2 raw_mpi -b 8 -e 64M      and      mpirun -np 2 idist-bench --backend mpi -b 8 -e 64M
// are comparable line by line. It links libidist only for the element types.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "harness.hpp"

namespace bench = idist::bench;
using bench::Collective;
using idist::DType;
using idist::ReduceOp;

namespace {

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(std::string(call) + " failed: " + text);
}

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, std::int8_t>) return MPI_INT8_T;
  if constexpr (std::is_same_v<T, std::uint8_t>) return MPI_UINT8_T;
  if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  return MPI_BYTE;  // the 16-bit floats: never reached, unsupported() refuses them
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return MPI_SUM;
    case ReduceOp::PRODUCT: return MPI_PROD;
    case ReduceOp::MIN: return MPI_MIN;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::AND: return MPI_BAND;
    case ReduceOp::OR: return MPI_BOR;
    case ReduceOp::XOR: return MPI_BXOR;
    case ReduceOp::AVG: break;  // MPI has none; idist-bench never asks for it
  }
  return MPI_OP_NULL;
}

int as_int(std::size_t n) {
  if (n > static_cast<std::size_t>(INT_MAX)) throw std::invalid_argument("count beyond MPI's int");
  return static_cast<int>(n);
}

class RawMpi {
 public:
  explicit RawMpi(bool thread_multiple) {
    // --thread-multiple: MPI as idist's mpi backend starts it (it calls MPI from any thread),
    // to tell that level's own cost from idist's.
    if (thread_multiple) {
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    } else {
      check(MPI_Init(nullptr, nullptr), "MPI_Init");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~RawMpi() { MPI_Finalize(); }
  RawMpi(const RawMpi&) = delete;
  RawMpi& operator=(const RawMpi&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  std::optional<std::string> unsupported(Collective, DType dtype, std::optional<ReduceOp>) const {
    if (dtype == DType::float16 || dtype == DType::bfloat16) return "MPI has no 16-bit floating types";
    return std::nullopt;
  }

  template <class T>
  void all_reduce(T* data, std::size_t count, ReduceOp op) {
    check(MPI_Allreduce(MPI_IN_PLACE, data, as_int(count), mpi_type<T>(), mpi_op(op), MPI_COMM_WORLD), "MPI_Allreduce");
  }
  template <class T>
  void reduce(T* data, std::size_t count, ReduceOp op, int root) {
    check(rank_ == root ? MPI_Reduce(MPI_IN_PLACE, data, as_int(count), mpi_type<T>(), mpi_op(op), root, MPI_COMM_WORLD)
                        : MPI_Reduce(data, nullptr, as_int(count), mpi_type<T>(), mpi_op(op), root, MPI_COMM_WORLD),
          "MPI_Reduce");
  }
  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t block, ReduceOp op) {
    check(MPI_Reduce_scatter_block(in, out, as_int(block), mpi_type<T>(), mpi_op(op), MPI_COMM_WORLD),
          "MPI_Reduce_scatter_block");
  }
  template <class T>
  void all_gather(const T* in, T* out, std::size_t block) {
    check(MPI_Allgather(in, as_int(block), mpi_type<T>(), out, as_int(block), mpi_type<T>(), MPI_COMM_WORLD),
          "MPI_Allgather");
  }
  template <class T>
  void broadcast(T* data, std::size_t count, int root) {
    check(MPI_Bcast(data, as_int(count), mpi_type<T>(), root, MPI_COMM_WORLD), "MPI_Bcast");
  }
  void barrier() { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  template <class T>
  void send(const T* data, std::size_t count, int peer) {
    check(MPI_Send(data, as_int(count), mpi_type<T>(), peer, 0, MPI_COMM_WORLD), "MPI_Send");
  }
  template <class T>
  void recv(T* data, std::size_t count, int peer) {
    check(MPI_Recv(data, as_int(count), mpi_type<T>(), peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  std::vector<double> all_gather_doubles(std::span<const double> mine) {
    std::vector<double> all(mine.size() * static_cast<std::size_t>(size_));
    all_gather(mine.data(), all.data(), mine.size());
    return all;
  }

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

int main(int argc, char** argv) {
  bench::Options options;
  CLI::App app("MPI called directly, timed and checked as idist-bench does (the reference for idist over mpi)",
               "raw_mpi");
  bench::CommandLine command_line(app, options);
  bool thread_multiple = false;
  app.add_flag("--thread-multiple", thread_multiple, "Start MPI with MPI_THREAD_MULTIPLE, as idist's mpi backend does");
  if (auto code = command_line.parse(argc, argv)) return *code;
  try {
    RawMpi comm(thread_multiple);
    if (options.root >= comm.size())
      return bench::usage_error("raw_mpi", "--root " + std::to_string(options.root) + " is not a rank (world size " +
                                               std::to_string(comm.size()) + ")");
    bench::HostMemory memory;
    bench::Report report({"raw_mpi", "raw", "mpi", "host"}, options, comm.rank(), comm.size());
    report.start();
    bench::Runner<RawMpi>(comm, memory, options, report).run();
    return report.finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "raw_mpi: %s\n", e.what());
    return 1;
  }
}
