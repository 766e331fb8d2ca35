#pragma once
// Element-wise reduction kernels for every (DType, ReduceOp): out[i] = a[i] op b[i]. Backends
// whose library lacks an operation borrow these (Gloo takes a function pointer; MPI wraps them
// in a user-defined MPI_Op for the 16-bit floats, hence exported), and tests use them as the
// host reference.
// 16-bit floats are widened to float, combined, and rounded back to nearest even.
// Each kernel exists once per instruction set (reduce/isa.hpp), with the same results bit for
// bit; the two-argument forms use the process's (reduce_isa()), the others name one.

#include <cstddef>

#include "idist/export.hpp"
#include "idist/types.hpp"
#include "reduce/isa.hpp"

namespace idist::detail {

// Gloo's reduction signature; `out` may alias `a` or `b`.
using ReduceFn = void (*)(void* out, const void* a, const void* b, std::size_t count);

// Throws InStepError for a bitwise op on a floating dtype (check_reduce_op).
IDIST_API ReduceFn reduce_kernel(DType dtype, ReduceOp op);
// The variant `isa`; InStepError where the CPU lacks it (cpu_has).
ReduceFn reduce_kernel(DType dtype, ReduceOp op, ReduceIsa isa);

// The argument check every backend shares: bitwise ops on integers only, AVG on floats only;
// InStepError otherwise.
IDIST_API void check_reduce_op(DType dtype, ReduceOp op);

// x[i] /= divisor on host memory, in the dtype's own arithmetic (float for the 16-bit floats):
// what AVG does after a SUM where the backend has no average of its own.
IDIST_API void divide(void* data, std::size_t count, DType dtype, int divisor);
void divide(void* data, std::size_t count, DType dtype, int divisor, ReduceIsa isa);

}  // namespace idist::detail
