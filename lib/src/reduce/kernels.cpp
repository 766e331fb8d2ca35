#include "reduce/kernels.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "in_step_error.hpp"
#include "reduce/half.hpp"
#include "reduce/isa.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#endif

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

// T to its arithmetic type and back; float16's through reduce/half.hpp, inline (its class's
// conversions are out of line, a call per element that keeps a loop scalar).
template <class T>
[[gnu::always_inline]] inline Wide<T> widen(T x) {
  if constexpr (std::is_same_v<T, float16>)
    return half_to_float(x.bits);
  else
    return static_cast<Wide<T>>(x);
}
template <class T>
[[gnu::always_inline]] inline T narrow(Wide<T> x) {
  if constexpr (std::is_same_v<T, float16>) {
    T out;
    out.bits = float_to_half(x);
    return out;
  } else {
    return static_cast<T>(x);
  }
}

// Op on two widened elements. For float16, a sum or product of two NaNs is a's NaN (its sign,
// the only part a half NaN keeps here): what x86 gives for the first operand of an SSE add or
// multiply, and what float16's kernels always gave when they called a conversion per element.
// Said outright, because the compiler may put either operand first once the loop is inline.
template <class T, class Op>
[[gnu::always_inline]] inline Wide<T> op_on(Wide<T> a, Wide<T> b) {
  const Wide<T> r = Op{}(a, b);
  if constexpr (std::is_same_v<T, float16> && (std::is_same_v<Op, Sum> || std::is_same_v<Op, Product>)) {
    // A mask rather than ?:, for the reason half.hpp gives: the loop stays vectorisable.
    const std::uint32_t a_is_nan = 0u - static_cast<std::uint32_t>(a != a);
    return std::bit_cast<float>((a_is_nan & std::bit_cast<std::uint32_t>(a)) |
                                (~a_is_nan & std::bit_cast<std::uint32_t>(r)));
  } else {
    return r;
  }
}

// The two loops every variant runs. Always inlined, so that each is compiled (and vectorised by
// -O3) for the instruction set of the function it lands in; the operators above and the 16-bit
// floats' conversions are inlined into it in turn. `out` may alias `a` or `b`: GCC checks the
// overlap at run time, and a distance of 0 keeps the vector loop.
template <class T, class Op>
[[gnu::always_inline]] inline void combine(void* out, const void* a, const void* b, std::size_t count) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < count; ++i) o[i] = narrow<T>(op_on<T, Op>(widen(x[i]), widen(y[i])));
}

template <class T>
[[gnu::always_inline]] inline void divide_each(T* x, std::size_t count, int divisor) {
  const auto d = static_cast<Wide<T>>(divisor);
  for (std::size_t i = 0; i < count; ++i) x[i] = narrow<T>(widen(x[i]) / d);
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
// float16 where the CPU has F16C (every AVX2 CPU made, but a hypervisor may hide it): 8 halves
// at a time converted by the hardware into a block of floats, the operator's float loop on the
// blocks (vectorised as float32's), and back. The hardware rounds as half.hpp does (to nearest
// even, explicitly, whatever MXCSR says), with the same subnormals and infinities; it keeps a
// NaN's payload where float16(float) makes it 0x7e00, so NaNs are made so here too (and a
// signalling half NaN it widens quieted, which only the payload, dropped on the way back, shows).
bool cpu_has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") != 0;
  }();
  return has;
}

[[gnu::target("avx2,f16c")]] inline void halves_to_floats(const float16* in, float* out, std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < count; ++i) out[i] = half_to_float(in[i].bits);
}

[[gnu::target("avx2,f16c")]] inline void floats_to_halves(const float* in, float16* out, std::size_t count) {
  const __m128i magnitude = _mm_set1_epi16(0x7fff);
  const __m128i infinity = _mm_set1_epi16(0x7c00);
  const __m128i sign = _mm_set1_epi16(static_cast<short>(0x8000));
  const __m128i quiet = _mm_set1_epi16(0x7e00);
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, magnitude), infinity);  // signed: magnitudes fit
    const __m128i canonical = _mm_or_si128(_mm_and_si128(h, sign), quiet);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_blendv_epi8(h, canonical, nan));
  }
  for (; i < count; ++i) out[i].bits = float_to_half(in[i]);
}

// Blocks that stay in L1 beside their inputs. `out` may alias `a` or `b`: a block is read whole
// before it is written.
inline constexpr std::size_t kHalfBlock = 512;

template <class Op>
[[gnu::target("avx2,f16c")]] void combine_f16c(void* out, const void* a, const void* b, std::size_t count) {
  auto* o = static_cast<float16*>(out);
  const auto* x = static_cast<const float16*>(a);
  const auto* y = static_cast<const float16*>(b);
  alignas(64) float fx[kHalfBlock];
  alignas(64) float fy[kHalfBlock];
  for (std::size_t at = 0; at < count; at += kHalfBlock) {
    const std::size_t n = std::min(kHalfBlock, count - at);
    halves_to_floats(x + at, fx, n);
    halves_to_floats(y + at, fy, n);
    for (std::size_t i = 0; i < n; ++i) fx[i] = op_on<float16, Op>(fx[i], fy[i]);
    floats_to_halves(fx, o + at, n);
  }
}

[[gnu::target("avx2,f16c")]] void divide_f16c(float16* x, std::size_t count, int divisor) {
  const auto d = static_cast<float>(divisor);
  alignas(64) float fx[kHalfBlock];
  for (std::size_t at = 0; at < count; at += kHalfBlock) {
    const std::size_t n = std::min(kHalfBlock, count - at);
    halves_to_floats(x + at, fx, n);
    for (std::size_t i = 0; i < n; ++i) fx[i] /= d;
    floats_to_halves(fx, x + at, n);
  }
}

struct Avx2 {
  template <class T, class Op>
  [[gnu::target("avx2")]] static void apply(void* out, const void* a, const void* b, std::size_t count) {
    if constexpr (std::is_same_v<T, float16>)
      if (cpu_has_f16c()) return combine_f16c<Op>(out, a, b, count);
    combine<T, Op>(out, a, b, count);
  }
  template <class T>
  [[gnu::target("avx2")]] static void divide(T* x, std::size_t count, int divisor) {
    if constexpr (std::is_same_v<T, float16>)
      if (cpu_has_f16c()) return divide_f16c(x, count, divisor);
    divide_each(x, count, divisor);
  }
};

// 512-bit registers asked for explicitly: some tunings prefer 256-bit vectors on AVX-512 CPUs.
struct Avx512 {
  template <class T, class Op>
  [[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")]] static void apply(
      void* out, const void* a, const void* b, std::size_t count) {
    if constexpr (std::is_same_v<T, float16>)  // F16C's 256-bit path: conversion, not width, bounds it
      if (cpu_has_f16c()) return combine_f16c<Op>(out, a, b, count);
    combine<T, Op>(out, a, b, count);
  }
  template <class T>
  [[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")]] static void divide(
      T* x, std::size_t count, int divisor) {
    if constexpr (std::is_same_v<T, float16>)
      if (cpu_has_f16c()) return divide_f16c(x, count, divisor);
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
