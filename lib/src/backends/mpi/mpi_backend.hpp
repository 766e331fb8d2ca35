#pragma once

#include "backend.hpp"

namespace idist::detail {

// MPI brings its own world: the processes one mpirun (or srun --mpi=pmix) started. Starts MPI
// when nobody has (MPI_THREAD_MULTIPLE, since completions and async collectives run on other
// threads) and says where this process sits in MPI_COMM_WORLD.
Layout mpi_layout();

// The world over a duplicate of MPI_COMM_WORLD. init.rank and init.size must be MPI's; the
// store is not used. Destroying it ends MPI if mpi_layout() started it.
std::unique_ptr<Backend> make_mpi_backend(const BackendInit& init);

}  // namespace idist::detail
