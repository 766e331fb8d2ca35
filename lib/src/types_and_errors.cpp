#include "idist/types.hpp"

#include <string>

#include "idist/errors.hpp"
#include "idist/idist.hpp"

namespace idist {

// IEEE binary16 <-> binary32 by bit manipulation, rounding to nearest even, with subnormals,
// infinities and NaN; no dependency on compiler support for _Float16.
float16::float16(float value) {
  const auto u = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN
    bits = static_cast<std::uint16_t>(sign | 0x7e00u);
  } else if (abs >= 0x477ff000u) {  // rounds to beyond the largest half (65504): infinity
    bits = static_cast<std::uint16_t>(sign | 0x7c00u);
  } else if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000000u) {  // below half the smallest subnormal
      bits = sign;
    } else {
      const std::uint32_t exponent = abs >> 23;
      const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126 - exponent;  // 14 + (127 - 15) - exponent + 1 - 1
      std::uint32_t half = mantissa >> shift;
      const std::uint32_t rest = mantissa & ((1u << shift) - 1);
      const std::uint32_t halfway = 1u << (shift - 1);
      if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
      bits = static_cast<std::uint16_t>(sign | half);
    }
  } else {
    std::uint32_t half = ((abs >> 13) - (112u << 10));  // rebias 127 -> 15
    const std::uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    bits = static_cast<std::uint16_t>(sign | half);
  }
}

float16::operator float() const {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  std::uint32_t u;
  if (exponent == 0x1f) {
    u = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    u = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    u = sign;
  } else {  // subnormal half: normalise
    std::uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(u);
}

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

}  // namespace idist
