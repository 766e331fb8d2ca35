#include "idist/types.hpp"

#include "idist/errors.hpp"

namespace idist {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::int8:
    case DType::uint8: return 1;
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

}  // namespace idist
