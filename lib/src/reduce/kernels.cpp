#include "reduce/kernels.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "in_step_error.hpp"
#include "reduce/isa.hpp"

namespace idist::detail {
namespace {

template <class T>
constexpr bool kIsHalf = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// The arithmetic type T is computed in: float for the 16-bit floats, T itself otherwise.
template <class T>
using Wide = std::conditional_t<kIsHalf<T>, float, T>;

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

// The two loops every variant runs. Always inlined, so that each is compiled (and vectorised by
// -O3) for the instruction set of the function it lands in; the operators above and bfloat16's
// inline conversions are inlined into it in turn (float16's are out of line, in
// types_and_errors.cpp: its loops stay scalar at every width). `out` may alias `a` or `b`: GCC
// checks the overlap at run time, and a distance of 0 keeps the vector loop.
template <class T, class Op>
[[gnu::always_inline]] inline void combine(void* out, const void* a, const void* b, std::size_t count) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < count; ++i) {
    o[i] = static_cast<T>(Op{}(static_cast<Wide<T>>(x[i]), static_cast<Wide<T>>(y[i])));
  }
}

template <class T>
[[gnu::always_inline]] inline void divide_each(T* x, std::size_t count, int divisor) {
  const auto d = static_cast<Wide<T>>(divisor);
  for (std::size_t i = 0; i < count; ++i) x[i] = static_cast<T>(static_cast<Wide<T>>(x[i]) / d);
}

// One struct per instruction set (reduce/isa.hpp), each the same two loops compiled for it.
// Function attributes rather than files built with -mavx2: an inline function of a header
// compiled in such a file (std::min, a conversion) could be emitted there and chosen by the
// linker for every caller, AVX2 instructions on a CPU without them; a target attribute changes
// the code of its own function only. The results are the baseline's bit for bit: the loops do
// one IEEE operation per element (nothing for FMA to contract, which AVX2 alone does not enable
// anyway), min and max select (compare and blend) rather than compute, and the division is
// exact-rounded at every width (tests/unit/test_reduce_isa.cpp compares them).
struct Baseline {
  template <class T, class Op>
  static void apply(void* out, const void* a, const void* b, std::size_t count) {
    combine<T, Op>(out, a, b, count);
  }
  template <class T>
  static void divide(T* x, std::size_t count, int divisor) {
    divide_each(x, count, divisor);
  }
};

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define IDIST_REDUCE_X86 1
struct Avx2 {
  template <class T, class Op>
  [[gnu::target("avx2")]] static void apply(void* out, const void* a, const void* b, std::size_t count) {
    combine<T, Op>(out, a, b, count);
  }
  template <class T>
  [[gnu::target("avx2")]] static void divide(T* x, std::size_t count, int divisor) {
    divide_each(x, count, divisor);
  }
};

// 512-bit registers asked for explicitly: some tunings prefer 256-bit vectors on AVX-512 CPUs.
struct Avx512 {
  template <class T, class Op>
  [[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")]] static void apply(
      void* out, const void* a, const void* b, std::size_t count) {
    combine<T, Op>(out, a, b, count);
  }
  template <class T>
  [[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")]] static void divide(
      T* x, std::size_t count, int divisor) {
    divide_each(x, count, divisor);
  }
};
#endif

template <class T, class V>
ReduceFn kernel_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return &V::template apply<T, Sum>;
    case ReduceOp::PRODUCT: return &V::template apply<T, Product>;
    case ReduceOp::MIN: return &V::template apply<T, Min>;
    case ReduceOp::MAX: return &V::template apply<T, Max>;
    case ReduceOp::AND:
    case ReduceOp::OR:
    case ReduceOp::XOR:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::AND) return &V::template apply<T, And>;
        if (op == ReduceOp::OR) return &V::template apply<T, Or>;
        return &V::template apply<T, Xor>;
      }
      break;
    case ReduceOp::AVG: throw InStepError("AVG is a SUM and a division, not an element-wise kernel");
  }
  throw InStepError("unknown reduce op");
}

template <class V>
ReduceFn kernel_of(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::int8: return kernel_for<std::int8_t, V>(op);
    case DType::uint8: return kernel_for<std::uint8_t, V>(op);
    case DType::int32: return kernel_for<std::int32_t, V>(op);
    case DType::int64: return kernel_for<std::int64_t, V>(op);
    case DType::float16: return kernel_for<float16, V>(op);
    case DType::bfloat16: return kernel_for<bfloat16, V>(op);
    case DType::float32: return kernel_for<float, V>(op);
    case DType::float64: return kernel_for<double, V>(op);
  }
  throw InStepError("unknown dtype");
}

template <class V>
void divide_as(void* data, std::size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::float16: return V::divide(static_cast<float16*>(data), count, divisor);
    case DType::bfloat16: return V::divide(static_cast<bfloat16*>(data), count, divisor);
    case DType::float32: return V::divide(static_cast<float*>(data), count, divisor);
    case DType::float64: return V::divide(static_cast<double*>(data), count, divisor);
    default: throw InStepError("divide: not a floating dtype: " + std::string(to_string(dtype)));
  }
}

// A variant the CPU lacks would die of SIGILL: refused here instead.
void check_cpu_has(ReduceIsa isa) {
  if (!cpu_has(isa))
    throw InStepError("reduction kernels: this CPU lacks " + std::string(to_string(isa)));
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
  divide(data, count, dtype, divisor, reduce_isa());
}

void divide(void* data, std::size_t count, DType dtype, int divisor, ReduceIsa isa) {
  check_cpu_has(isa);
  switch (isa) {
#ifdef IDIST_REDUCE_X86
    case ReduceIsa::avx2: return divide_as<Avx2>(data, count, dtype, divisor);
    case ReduceIsa::avx512: return divide_as<Avx512>(data, count, dtype, divisor);
#endif
    default: return divide_as<Baseline>(data, count, dtype, divisor);
  }
}

ReduceFn reduce_kernel(DType dtype, ReduceOp op) {
  return reduce_kernel(dtype, op, reduce_isa());
}

ReduceFn reduce_kernel(DType dtype, ReduceOp op, ReduceIsa isa) {
  check_reduce_op(dtype, op);
  check_cpu_has(isa);
  switch (isa) {
#ifdef IDIST_REDUCE_X86
    case ReduceIsa::avx2: return kernel_of<Avx2>(dtype, op);
    case ReduceIsa::avx512: return kernel_of<Avx512>(dtype, op);
#endif
    default: return kernel_of<Baseline>(dtype, op);
  }
}

}  // namespace idist::detail
