// MPI's types and ops for idist's (types.hpp).

#include "backends/mpi/types.hpp"

#include <array>

#include "backends/mpi/process.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail::mpi {
namespace {

template <DType D, ReduceOp Op>
void reduce_own(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_kernel(D, Op)(inout, inout, in, static_cast<std::size_t>(*len));
}

template <DType D>
constexpr std::array<MPI_User_function*, 4> kHalfFunctions = {
    &reduce_own<D, ReduceOp::SUM>, &reduce_own<D, ReduceOp::PRODUCT>, &reduce_own<D, ReduceOp::MIN>,
    &reduce_own<D, ReduceOp::MAX>};
static_assert(static_cast<int>(ReduceOp::SUM) == 0 && static_cast<int>(ReduceOp::MAX) == 3,
              "half_ops is indexed by ReduceOp");

// Attributes of MPI_COMM_SELF are deleted first thing in MPI_Finalize, whoever calls it (us or
// a program that started MPI itself): the one moment at which freeing MPI objects is still
// legal and certainly last.
int free_own_ops(MPI_Comm, int, void*, void*) {
  auto& p = process();
  for (auto& row : p.half_ops)
    for (auto& op : row) MPI_Op_free(&op);
  for (auto& row : p.float_ops)
    for (auto& op : row) MPI_Op_free(&op);
  MPI_Type_free(&p.half_type);
  p.own_ops_ready = false;
  return MPI_SUCCESS;
}

const MpiProcess& own_ops() {
  auto& p = process();
  std::lock_guard lock(p.mu);
  if (p.own_ops_ready) return p;
  check(MPI_Type_contiguous(2, MPI_BYTE, &p.half_type), "MPI_Type_contiguous");
  check(MPI_Type_commit(&p.half_type), "MPI_Type_commit");
  for (std::size_t op = 0; op < 4; ++op) {
    check(MPI_Op_create(kHalfFunctions<DType::float16>[op], 1, &p.half_ops[0][op]), "MPI_Op_create");
    check(MPI_Op_create(kHalfFunctions<DType::bfloat16>[op], 1, &p.half_ops[1][op]), "MPI_Op_create");
  }
  check(MPI_Op_create(&reduce_own<DType::float32, ReduceOp::MIN>, 1, &p.float_ops[0][0]), "MPI_Op_create");
  check(MPI_Op_create(&reduce_own<DType::float32, ReduceOp::MAX>, 1, &p.float_ops[0][1]), "MPI_Op_create");
  check(MPI_Op_create(&reduce_own<DType::float64, ReduceOp::MIN>, 1, &p.float_ops[1][0]), "MPI_Op_create");
  check(MPI_Op_create(&reduce_own<DType::float64, ReduceOp::MAX>, 1, &p.float_ops[1][1]), "MPI_Op_create");
  int keyval = MPI_KEYVAL_INVALID;
  check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_own_ops, &keyval, nullptr), "MPI_Comm_create_keyval");
  check(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr), "MPI_Comm_set_attr");
  MPI_Comm_free_keyval(&keyval);  // the attribute keeps it alive until it is deleted
  p.own_ops_ready = true;
  return p;
}

}  // namespace

MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::int8: return MPI_INT8_T;
    case DType::uint8: return MPI_UINT8_T;
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::float16:
    case DType::bfloat16: return own_ops().half_type;
  }
  throw InStepError("unknown dtype");
}

MPI_Op reduce_op(DType dtype, ReduceOp op) {
  if (dtype == DType::float16 || dtype == DType::bfloat16) {
    if (is_bitwise(op))
      throw InStepError(fmt::format("MPI has no {} on {}", to_string(op), to_string(dtype)));
    return own_ops().half_ops[dtype == DType::float16 ? 0 : 1][static_cast<std::size_t>(op)];
  }
  if ((dtype == DType::float32 || dtype == DType::float64) && (op == ReduceOp::MIN || op == ReduceOp::MAX))
    return own_ops().float_ops[dtype == DType::float32 ? 0 : 1][op == ReduceOp::MIN ? 0 : 1];
  switch (op) {
    case ReduceOp::SUM: return MPI_SUM;
    case ReduceOp::PRODUCT: return MPI_PROD;
    case ReduceOp::MIN: return MPI_MIN;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::AND: return MPI_BAND;
    case ReduceOp::OR: return MPI_BOR;
    case ReduceOp::XOR: return MPI_BXOR;
    case ReduceOp::AVG: break;  // ProcessGroup reduces with SUM and divides
  }
  throw InStepError("unknown reduce op");
}

}  // namespace idist::detail::mpi
