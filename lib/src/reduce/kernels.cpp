#include "reduce/kernels.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "in_step_error.hpp"

namespace idist::detail {
namespace {

template <class T>
constexpr bool kIsHalf = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// The arithmetic type T is computed in: float for the 16-bit floats, T itself otherwise.
template <class T>
using Wide = std::conditional_t<kIsHalf<T>, float, T>;

template <class T, class Op>
void apply(void* out, const void* a, const void* b, std::size_t count) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < count; ++i) {
    o[i] = static_cast<T>(Op{}(static_cast<Wide<T>>(x[i]), static_cast<Wide<T>>(y[i])));
  }
}

struct Sum {
  template <class W>
  W operator()(W a, W b) const { return static_cast<W>(a + b); }
};
struct Product {
  template <class W>
  W operator()(W a, W b) const { return static_cast<W>(a * b); }
};
// A NaN on any rank wins, whichever rank holds it (as torch.minimum and torch.maximum): the
// idiom of a MAX over each rank's loss to catch a NaN anywhere must not depend on the order in
// which a transport combines the ranks. std::min and std::max keep or drop it by that order.
struct Min {
  template <class W>
  W operator()(W a, W b) const {
    if constexpr (std::is_floating_point_v<W>) return (b < a || b != b) ? b : a;
    return std::min(a, b);
  }
};
struct Max {
  template <class W>
  W operator()(W a, W b) const {
    if constexpr (std::is_floating_point_v<W>) return (b > a || b != b) ? b : a;
    return std::max(a, b);
  }
};
struct And {
  template <class W>
  W operator()(W a, W b) const { return static_cast<W>(a & b); }
};
struct Or {
  template <class W>
  W operator()(W a, W b) const { return static_cast<W>(a | b); }
};
struct Xor {
  template <class W>
  W operator()(W a, W b) const { return static_cast<W>(a ^ b); }
};

template <class T>
ReduceFn kernel_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return &apply<T, Sum>;
    case ReduceOp::PRODUCT: return &apply<T, Product>;
    case ReduceOp::MIN: return &apply<T, Min>;
    case ReduceOp::MAX: return &apply<T, Max>;
    case ReduceOp::AND:
    case ReduceOp::OR:
    case ReduceOp::XOR:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::AND) return &apply<T, And>;
        if (op == ReduceOp::OR) return &apply<T, Or>;
        return &apply<T, Xor>;
      }
      break;
    case ReduceOp::AVG: throw InStepError("AVG is a SUM and a division, not an element-wise kernel");
  }
  throw InStepError("unknown reduce op");
}

}  // namespace

void check_reduce_op(DType dtype, ReduceOp op) {
  if (is_bitwise(op) && !is_integer(dtype))
    throw InStepError(std::string(to_string(op)) + " is defined on integer dtypes only, not " +
                      std::string(to_string(dtype)));
  if (op == ReduceOp::AVG && is_integer(dtype))
    throw InStepError("AVG is defined on floating dtypes only, not " + std::string(to_string(dtype)) +
                      " (an integer average would be rounded): reduce with SUM and divide");
}

void divide(void* data, std::size_t count, DType dtype, int divisor) {
  const auto each = [&]<class T>(T* x) {
    const auto d = static_cast<Wide<T>>(divisor);
    for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<T>(static_cast<Wide<T>>(x[i]) / d);
  };
  switch (dtype) {
    case DType::float16: return each(static_cast<float16*>(data));
    case DType::bfloat16: return each(static_cast<bfloat16*>(data));
    case DType::float32: return each(static_cast<float*>(data));
    case DType::float64: return each(static_cast<double*>(data));
    default: throw InStepError("divide: not a floating dtype: " + std::string(to_string(dtype)));
  }
}

ReduceFn reduce_kernel(DType dtype, ReduceOp op) {
  check_reduce_op(dtype, op);
  switch (dtype) {
    case DType::int8: return kernel_for<std::int8_t>(op);
    case DType::uint8: return kernel_for<std::uint8_t>(op);
    case DType::int32: return kernel_for<std::int32_t>(op);
    case DType::int64: return kernel_for<std::int64_t>(op);
    case DType::float16: return kernel_for<float16>(op);
    case DType::bfloat16: return kernel_for<bfloat16>(op);
    case DType::float32: return kernel_for<float>(op);
    case DType::float64: return kernel_for<double>(op);
  }
  throw InStepError("unknown dtype");
}

}  // namespace idist::detail
