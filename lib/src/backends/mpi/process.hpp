#pragma once
// MPI itself, one per process: it starts once and ends once, and only the one who started it
// should end it. This is all idist remembers about it, and the MPI objects idist makes once
// (the 16-bit float type and the ops over our own kernels: types.cpp).

#include <atomic>
#include <mutex>

#include "backend.hpp"
#include "backends/mpi/calls.hpp"

namespace idist::detail::mpi {

struct MpiProcess {
  std::mutex mu;
  bool started_by_us = false;
  std::atomic<int> backends{0};     // built and alive: the program is in the middle of a job
  std::atomic<bool> built{false};   // one was built: with none alive, idist::finalize() ran
  bool own_ops_ready = false;
  MPI_Datatype half_type;  // two opaque bytes: float16 and bfloat16 alike
  MPI_Op half_ops[2][4];   // [float16, bfloat16][SUM, PRODUCT, MIN, MAX]
  MPI_Op float_ops[2][2];  // [float32, float64][MIN, MAX]: a NaN wins, as in our other backends
};

// Never destroyed: the exit hook and a world backend torn down by static destruction may
// both still need it.
MpiProcess& process();

// Starts MPI unless someone has; either way it must allow calls from any thread at any time.
void start_mpi();

// Frees a communicator (unless MPI has ended) and forgets it.
void free_comm(MPI_Comm& comm);

}  // namespace idist::detail::mpi
