#pragma once
// What MPI is given for idist's dtypes and reduce ops: its own types and ops where it has
// them; a 16-bit opaque type, and ops over our own kernels, where it has none (every op on the
// 16-bit floats) or keeps or drops a NaN by the ranks' order (MIN and MAX on the others).
// Made once per process, freed when MPI ends (whoever ends it).

#include "backends/mpi/calls.hpp"
#include "idist/types.hpp"

namespace idist::detail::mpi {

// The one switch over dtypes in this backend.
MPI_Datatype element_type(DType dtype);
MPI_Op reduce_op(DType dtype, ReduceOp op);

}  // namespace idist::detail::mpi
