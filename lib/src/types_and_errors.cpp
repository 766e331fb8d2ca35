#include "idist/types.hpp"

#include <string>

#include "idist/errors.hpp"
#include "idist/idist.hpp"
#include "reduce/half.hpp"

namespace idist {

// IEEE binary16 <-> binary32 by bit manipulation (reduce/half.hpp, which the reduction kernels
// inline), rounding to nearest even, with subnormals, infinities and NaN; no dependency on
// compiler support for _Float16.
float16::float16(float value) : bits(detail::float_to_half(value)) {}

float16::operator float() const { return detail::half_to_float(bits); }

void Tensor::check_dtype(DType wanted) const {
  if (wanted != dtype)
    detail::refuse("Tensor::as", "the tensor holds " + std::string(to_string(dtype)) + ", not " +
                                     std::string(to_string(wanted)));
}

bool is_integer(DType dtype) {
  switch (dtype) {
    case DType::int8:
    case DType::uint8:
    case DType::int32:
    case DType::int64: return true;
    default: return false;
  }
}

bool is_bitwise(ReduceOp op) { return op == ReduceOp::AND || op == ReduceOp::OR || op == ReduceOp::XOR; }

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::int8:
    case DType::uint8: return 1;
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::int32:
    case DType::float32: return 4;
    case DType::int64:
    case DType::float64: return 8;
  }
  return 0;
}

std::string_view to_string(DType dtype) {
  switch (dtype) {
    case DType::int8: return "int8";
    case DType::uint8: return "uint8";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::float32: return "float32";
    case DType::float64: return "float64";
  }
  return "?";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::AND: return "AND";
    case ReduceOp::OR: return "OR";
    case ReduceOp::XOR: return "XOR";
    case ReduceOp::AVG: return "AVG";
  }
  return "?";
}

namespace {
std::string format(const ErrorSite& s, const std::string& detail) {
  std::string where = s.rank >= 0 ? "[idist rank " + std::to_string(s.rank) + "/" + std::to_string(s.world_size) + "] "
                                  : std::string("[idist] ");
  std::string op = s.op.empty() ? std::string() : s.op + (s.backend.empty() ? "" : "(" + s.backend + ")") + ": ";
  return where + op + detail;
}
}  // namespace

Error::Error(ErrorSite site, const std::string& detail)
    : std::runtime_error(format(site, detail)), site_(std::move(site)), detail_(detail) {}

PeerLostError::PeerLostError(ErrorSite site, const std::string& detail, int lost_rank)
    : Error(std::move(site), detail), lost_rank_(lost_rank) {}

}  // namespace idist
