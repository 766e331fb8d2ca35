// The reduction kernels at every instruction set this CPU has (reduce/isa.hpp) against the
// baseline, bit for bit: every dtype and op, and the AVG division, on random data salted with
// the values where vector code could part from scalar code (NaN with either sign and any
// payload, signalling NaN, infinities, -0.0, subnormals, the largest finite values, the integer
// extremes), at lengths around every vector width, at pointers off the vectors' alignment, and
// with `out` aliasing `a` or `b` as the backends call them; and each, the baseline too, against
// the rules written out element by element, apart from the kernels' code. A variant the CPU
// lacks is skipped with a MESSAGE saying so.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <bit>
#include <cstring>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "idist/types.hpp"
#include "in_step_error.hpp"
#include "reduce/isa.hpp"
#include "reduce/kernels.hpp"

using namespace idist;
using detail::ReduceIsa;

namespace {

constexpr DType kDTypes[] = {DType::int8,    DType::uint8,    DType::int32,   DType::int64,
                             DType::float16, DType::bfloat16, DType::float32, DType::float64};
constexpr ReduceOp kOps[] = {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX,
                             ReduceOp::AND, ReduceOp::OR,      ReduceOp::XOR};
// Around 16, 32 and 64 bytes of every element size, odd ones, and long enough for the loops'
// main bodies and their tails.
constexpr std::size_t kLengths[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129, 255, 257, 1000, 4099};
constexpr std::size_t kMaxOffset = 3;  // elements: every pointer 0 to 3 elements past a 64-byte boundary

template <class F>
F float_special(std::mt19937_64& rng) {
  using Bits = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  constexpr int kMantissa = std::numeric_limits<F>::digits - 1;
  const Bits exponent_all = ((Bits{1} << (sizeof(F) * 8 - 1 - kMantissa)) - 1) << kMantissa;
  const Bits sign = Bits{1} << (sizeof(F) * 8 - 1);
  const Bits payload = static_cast<Bits>(rng()) & ((Bits{1} << kMantissa) - 1);
  const bool negative = rng() & 1u;
  Bits bits = 0;
  switch (rng() % 8) {
    case 0: bits = exponent_all | (Bits{1} << (kMantissa - 1)) | payload; break;                  // quiet NaN
    case 1: bits = exponent_all | ((payload & ((Bits{1} << (kMantissa - 1)) - 1)) | 1u); break;   // signalling NaN
    case 2: bits = exponent_all; break;                                                           // infinity
    case 3: bits = 0; break;                                                                      // zero
    case 4: bits = payload | 1u; break;                                                           // subnormal
    case 5: return negative ? std::numeric_limits<F>::lowest() : std::numeric_limits<F>::max();
    case 6: return negative ? -F(1) : F(1);
    default: bits = std::bit_cast<Bits>(F(2)) | payload; break;                                   // [2, 4)
  }
  if (negative) bits |= sign;
  return std::bit_cast<F>(bits);
}

template <class T>
T integer_special(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0: return std::numeric_limits<T>::min();
    case 1: return std::numeric_limits<T>::max();
    case 2: return T(0);
    case 3: return static_cast<T>(-1);
    default: return T(1);
  }
}

// `count` elements of `dtype`: a quarter special values, the rest random (bit patterns for the
// integers and 16-bit floats, which then cover every class; for float32 and float64, values
// between -1000 and 1000 of random magnitude, whose sums and products round).
std::vector<char> random_elements(DType dtype, std::size_t count, std::mt19937_64& rng) {
  std::vector<char> out(count * dtype_size(dtype));
  for (std::size_t i = 0; i < count; ++i) {
    char* at = out.data() + i * dtype_size(dtype);
    const bool special = rng() % 4 == 0;
    const auto store = [&](auto v) { std::memcpy(at, &v, sizeof v); };
    switch (dtype) {
      case DType::int8: store(special ? integer_special<std::int8_t>(rng) : static_cast<std::int8_t>(rng())); break;
      case DType::uint8: store(special ? integer_special<std::uint8_t>(rng) : static_cast<std::uint8_t>(rng())); break;
      case DType::int32: store(special ? integer_special<std::int32_t>(rng) : static_cast<std::int32_t>(rng())); break;
      case DType::int64: store(special ? integer_special<std::int64_t>(rng) : static_cast<std::int64_t>(rng())); break;
      case DType::float16:
      case DType::bfloat16: store(static_cast<std::uint16_t>(rng())); break;
      case DType::float32:
        store(special ? float_special<float>(rng)
                      : static_cast<float>(std::uniform_real_distribution<double>(-1000, 1000)(rng) /
                                           static_cast<double>(1u << (rng() % 20))));
        break;
      case DType::float64:
        store(special ? float_special<double>(rng)
                      : std::uniform_real_distribution<double>(-1000, 1000)(rng) / static_cast<double>(1u << (rng() % 20)));
        break;
    }
  }
  return out;
}

// A buffer whose element `offset` is `offset` elements past a 64-byte boundary.
struct Buffer {
  std::vector<char> storage;
  char* data;
  Buffer(const std::vector<char>& elements, std::size_t offset, std::size_t element)
      : storage(elements.size() + 64 + kMaxOffset * element) {
    auto base = reinterpret_cast<std::uintptr_t>(storage.data());
    data = storage.data() + ((64 - base % 64) % 64) + offset * element;
    if (!elements.empty()) std::memcpy(data, elements.data(), elements.size());
  }
};

std::string hex(const char* p, std::size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = n; i-- > 0;) {  // little-endian: the most significant byte first
    const auto b = static_cast<unsigned char>(p[i]);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

// The first element where two results differ, described for a failure message; empty if none.
std::string first_difference(const char* want, const char* got, const char* a, const char* b, std::size_t count,
                             std::size_t element) {
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(want + i * element, got + i * element, element) == 0) continue;
    return "element " + std::to_string(i) + ": a=0x" + hex(a + i * element, element) + " b=0x" +
           hex(b + i * element, element) + " baseline 0x" + hex(want + i * element, element) + ", got 0x" +
           hex(got + i * element, element);
  }
  return {};
}

// The variants other than baseline that this CPU has; the others reported as skipped.
std::vector<ReduceIsa> variants_to_test() {
  std::vector<ReduceIsa> out;
  for (auto isa : detail::kReduceIsas) {
    if (isa == ReduceIsa::baseline) continue;
    if (detail::cpu_has(isa))
      out.push_back(isa);
    else
      MESSAGE("skipped: this CPU lacks " << detail::to_string(isa) << ", its kernels are not tested here");
  }
  return out;
}

enum class Alias { none, out_is_a, out_is_b };
constexpr Alias kAliases[] = {Alias::none, Alias::out_is_a, Alias::out_is_b};

}  // namespace

TEST_CASE("reduce kernels: every variant this CPU has gives the baseline's bits, every dtype and op") {
  const auto variants = variants_to_test();
  std::mt19937_64 rng(29);
  int compared = 0;
  for (auto isa : variants) {
    for (auto dtype : kDTypes) {
      const auto element = dtype_size(dtype);
      for (auto op : kOps) {
        if (is_bitwise(op) && !is_integer(dtype)) continue;
        const auto want_fn = detail::reduce_kernel(dtype, op, ReduceIsa::baseline);
        const auto got_fn = detail::reduce_kernel(dtype, op, isa);
        for (auto count : kLengths) {
          for (auto alias : kAliases) {
            // Offsets of out, a and b: each pattern of alignment, and differing from one another.
            const std::size_t oo = rng() % (kMaxOffset + 1), oa = rng() % (kMaxOffset + 1), ob = rng() % (kMaxOffset + 1);
            const auto a = random_elements(dtype, count, rng);
            const auto b = random_elements(dtype, count, rng);
            std::vector<char> results[2];
            int which = 0;
            for (auto fn : {want_fn, got_fn}) {
              Buffer ba(a, alias == Alias::out_is_a ? oo : oa, element);
              Buffer bb(b, alias == Alias::out_is_b ? oo : ob, element);
              Buffer bo(std::vector<char>(count * element, '\x5a'), oo, element);
              char* out = alias == Alias::out_is_a ? ba.data : alias == Alias::out_is_b ? bb.data : bo.data;
              fn(out, ba.data, bb.data, count);
              results[which++].assign(out, out + count * element);
            }
            const auto diff = first_difference(results[0].data(), results[1].data(), a.data(), b.data(), count, element);
            INFO(detail::to_string(isa), " ", to_string(dtype), " ", to_string(op), " count ", count, " offsets out ",
                 oo, " a ", oa, " b ", ob, " alias ", static_cast<int>(alias));
            CHECK_MESSAGE(diff.empty(), diff);
            ++compared;
          }
        }
      }
    }
  }
  MESSAGE(compared << " reductions compared with the baseline");
}

TEST_CASE("reduce kernels: the AVG division of every variant this CPU has gives the baseline's bits") {
  const auto variants = variants_to_test();
  std::mt19937_64 rng(30);
  for (auto isa : variants) {
    for (auto dtype : {DType::float16, DType::bfloat16, DType::float32, DType::float64}) {
      const auto element = dtype_size(dtype);
      for (int divisor : {1, 2, 3, 7, 8, 1000}) {
        for (auto count : kLengths) {
          const std::size_t offset = rng() % (kMaxOffset + 1);
          const auto x = random_elements(dtype, count, rng);
          Buffer want(x, offset, element);
          Buffer got(x, offset, element);
          detail::divide(want.data, count, dtype, divisor, ReduceIsa::baseline);
          detail::divide(got.data, count, dtype, divisor, isa);
          const auto diff = first_difference(want.data, got.data, x.data(), x.data(), count, element);
          INFO(detail::to_string(isa), " ", to_string(dtype), " / ", divisor, " count ", count, " offset ", offset);
          CHECK_MESSAGE(diff.empty(), diff);
        }
      }
    }
  }
}

TEST_CASE("reduce kernels: NaN wins MIN and MAX whichever side holds it, in every variant") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (auto isa : detail::kReduceIsas) {
    if (!detail::cpu_has(isa)) continue;
    INFO(detail::to_string(isa));
    // 33 elements: a vector body and a scalar tail, NaN in both and on both sides.
    std::vector<float> a(33, 1.0f), b(33, 2.0f), out(33);
    a[0] = a[32] = nan;
    b[1] = b[31] = nan;
    for (auto op : {ReduceOp::MIN, ReduceOp::MAX}) {
      detail::reduce_kernel(DType::float32, op, isa)(out.data(), a.data(), b.data(), out.size());
      for (std::size_t i : {0, 1, 31, 32}) CHECK(out[i] != out[i]);
      CHECK(out[2] == (op == ReduceOp::MIN ? 1.0f : 2.0f));
    }
  }
}

namespace {

// float16's conversions as they were written before the kernels inlined them (one case per
// class of value, a loop to normalise a subnormal): the reference the inline, branch-free ones
// (reduce/half.hpp) and the F16C variant must equal bit for bit. (All 2^32 floats were compared
// once, by hand: 0 differences; the tests below take every half and a stride of the floats.)
std::uint16_t reference_to_half(float value) {
  const auto u = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {                                                    // subnormal or zero
    if (abs < 0x33000000u) return sign;
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (abs >> 13) - (112u << 10);
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float reference_to_float(std::uint16_t bits) {
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
  } else {
    std::uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    u = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(u);
}

// One element of a float16 reduction as it always was: widen, combine in float (a NaN in a
// wins a SUM or PRODUCT: x86's first operand), round back.
std::uint16_t reference_op(ReduceOp op, std::uint16_t a, std::uint16_t b) {
  const float x = reference_to_float(a), y = reference_to_float(b);
  switch (op) {
    case ReduceOp::SUM: return reference_to_half(x != x ? x : x + y);
    case ReduceOp::PRODUCT: return reference_to_half(x != x ? x : x * y);
    case ReduceOp::MIN: return reference_to_half((y < x || y != y) ? y : x);
    case ReduceOp::MAX: return reference_to_half((y > x || y != y) ? y : x);
    default: return 0;
  }
}

std::string hex32(std::uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

}  // namespace

TEST_CASE("float16 conversions: every half, and a stride of every float, as the reference converts them") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    float16 x;
    x.bits = static_cast<std::uint16_t>(h);
    const auto want = std::bit_cast<std::uint32_t>(reference_to_float(x.bits));
    if (std::bit_cast<std::uint32_t>(static_cast<float>(x)) != want) FAIL_CHECK("half " << hex32(h));
    // And back: a half is exact in float, so it returns as it was (a NaN as 0x7e00 with its sign).
    const std::uint16_t back = (h & 0x7fffu) > 0x7c00u ? static_cast<std::uint16_t>((h & 0x8000u) | 0x7e00u)
                                                        : static_cast<std::uint16_t>(h);
    if (float16(static_cast<float>(x)).bits != back) FAIL_CHECK("half " << hex32(h) << " and back");
  }
  // 2^32 / 65537: every exponent and sign, mantissas spread across; then the rounding edges.
  int wrong = 0;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 65537) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(u));
    if (float16(f).bits != reference_to_half(f) && wrong++ < 5) FAIL_CHECK("float " << hex32(u));
  }
  for (std::uint32_t edge : {0x477ff000u, 0x477fefffu, 0x47800000u, 0x38800000u, 0x387fffffu, 0x33000000u,
                             0x33000001u, 0x32ffffffu, 0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x00000001u}) {
    for (std::uint32_t near = edge - 2; near != edge + 3; ++near) {
      for (std::uint32_t sign : {0u, 0x80000000u}) {
        const float f = std::bit_cast<float>(near | sign);
        CHECK_MESSAGE(float16(f).bits == reference_to_half(f), "float " << hex32(near | sign));
      }
    }
  }
}

TEST_CASE("float16 reductions: every variant gives what float16's kernels always gave, element by element") {
  std::mt19937_64 rng(16);
  for (auto isa : detail::kReduceIsas) {
    if (!detail::cpu_has(isa)) continue;
    for (auto op : {ReduceOp::SUM, ReduceOp::PRODUCT, ReduceOp::MIN, ReduceOp::MAX}) {
      const auto kernel = detail::reduce_kernel(DType::float16, op, isa);
      for (auto count : kLengths) {
        std::vector<std::uint16_t> a(count), b(count), out(count);
        for (std::size_t i = 0; i < count; ++i) {
          a[i] = static_cast<std::uint16_t>(rng());
          // Half of them finite and near a's, whose sums round; the rest any bits.
          b[i] = rng() % 2 ? static_cast<std::uint16_t>(rng()) : static_cast<std::uint16_t>(a[i] ^ (rng() & 0x83ffu));
        }
        kernel(out.data(), a.data(), b.data(), count);
        int wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const auto want = reference_op(op, a[i], b[i]);
          if (out[i] != want && wrong++ < 3)
            FAIL_CHECK(detail::to_string(isa) << " " << to_string(op) << " count " << count << " element " << i
                                              << ": a=" << hex32(a[i]) << " b=" << hex32(b[i]) << " want "
                                              << hex32(want) << " got " << hex32(out[i]));
        }
      }
    }
    // AVG's division, in float.
    for (int divisor : {2, 3, 7}) {
      std::vector<std::uint16_t> x(1000);
      for (auto& v : x) v = static_cast<std::uint16_t>(rng());
      auto got = x;
      detail::divide(got.data(), got.size(), DType::float16, divisor, isa);
      for (std::size_t i = 0; i < x.size(); ++i)
        CHECK(got[i] == reference_to_half(reference_to_float(x[i]) / static_cast<float>(divisor)));
    }
  }
}

namespace {

// Every dtype's rules written out one element at a time, apart from the kernels' code: integers
// wrap (two's complement), floats combine in their own precision (16-bit ones in float, rounded
// to nearest even), a NaN on either side gives NaN (MIN and MAX included), AND/OR/XOR are
// bitwise. NaN results are compared as NaN, not by payload, which the rules leave open.
template <class T>
T wrap(ReduceOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  const auto ua = static_cast<U>(a), ub = static_cast<U>(b);
  switch (op) {
    case ReduceOp::SUM: return static_cast<T>(static_cast<U>(ua + ub));
    case ReduceOp::PRODUCT: return static_cast<T>(static_cast<U>(static_cast<std::uint64_t>(ua) * ub));
    case ReduceOp::MIN: return a < b ? a : b;
    case ReduceOp::MAX: return a > b ? a : b;
    case ReduceOp::AND: return static_cast<T>(ua & ub);
    case ReduceOp::OR: return static_cast<T>(ua | ub);
    default: return static_cast<T>(ua ^ ub);
  }
}

template <class F>
F combine(ReduceOp op, F a, F b) {
  if (a != a) return a;
  if (b != b) return b;
  switch (op) {
    case ReduceOp::SUM: return a + b;
    case ReduceOp::PRODUCT: return a * b;
    case ReduceOp::MIN: return b < a ? b : a;
    default: return b > a ? b : a;
  }
}

std::uint16_t to_bfloat16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if (f != f) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bfloat16(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

// Element i of `a op b` by the rules, as bytes; `nan` says the result is a NaN.
std::vector<char> reference_element(DType dtype, ReduceOp op, const char* a, const char* b, bool& nan) {
  std::vector<char> out(dtype_size(dtype));
  nan = false;
  const auto put = [&](auto v) { std::memcpy(out.data(), &v, sizeof v); };
  const auto get = [](const char* p, auto zero) {
    decltype(zero) v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (dtype) {
    case DType::int8: put(wrap(op, get(a, std::int8_t{}), get(b, std::int8_t{}))); break;
    case DType::uint8: put(static_cast<std::uint8_t>(wrap(op, get(a, std::uint8_t{}), get(b, std::uint8_t{})))); break;
    case DType::int32: put(wrap(op, get(a, std::int32_t{}), get(b, std::int32_t{}))); break;
    case DType::int64: put(wrap(op, get(a, std::int64_t{}), get(b, std::int64_t{}))); break;
    case DType::float32: {
      const auto r = combine(op, get(a, 0.0f), get(b, 0.0f));
      nan = r != r;
      put(r);
      break;
    }
    case DType::float64: {
      const auto r = combine(op, get(a, 0.0), get(b, 0.0));
      nan = r != r;
      put(r);
      break;
    }
    case DType::float16: {
      const auto r = combine(op, reference_to_float(get(a, std::uint16_t{})), reference_to_float(get(b, std::uint16_t{})));
      nan = r != r;
      put(reference_to_half(r));
      break;
    }
    case DType::bfloat16: {
      const auto r = combine(op, from_bfloat16(get(a, std::uint16_t{})), from_bfloat16(get(b, std::uint16_t{})));
      nan = r != r;
      put(to_bfloat16(r));
      break;
    }
  }
  return out;
}

bool is_nan(DType dtype, const char* p) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, p, dtype_size(dtype));
  switch (dtype) {
    case DType::float16: return (bits & 0x7fffu) > 0x7c00u;
    case DType::bfloat16: return (bits & 0x7fffu) > 0x7f80u;
    case DType::float32: return (bits & 0x7fffffffu) > 0x7f800000u;
    case DType::float64: return (bits & 0x7fffffffffffffffu) > 0x7ff0000000000000u;
    default: return false;
  }
}

}  // namespace

TEST_CASE("reduce kernels: every variant, baseline included, follows the rules written out element by element") {
  std::mt19937_64 rng(31);
  int compared = 0;
  for (auto isa : detail::kReduceIsas) {
    if (!detail::cpu_has(isa)) continue;
    for (auto dtype : kDTypes) {
      const auto element = dtype_size(dtype);
      for (auto op : kOps) {
        if (is_bitwise(op) && !is_integer(dtype)) continue;
        const auto fn = detail::reduce_kernel(dtype, op, isa);
        for (auto count : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{129}, std::size_t{1000}}) {
          const auto a = random_elements(dtype, count, rng);
          const auto b = random_elements(dtype, count, rng);
          std::vector<char> out(count * element);
          fn(out.data(), a.data(), b.data(), count);
          int wrong = 0;
          for (std::size_t i = 0; i < count; ++i) {
            bool nan = false;
            const char* got = out.data() + i * element;
            const auto want = reference_element(dtype, op, a.data() + i * element, b.data() + i * element, nan);
            const bool ok = nan ? is_nan(dtype, got) : std::memcmp(want.data(), got, element) == 0;
            if (!ok && wrong++ < 3)
              FAIL_CHECK(detail::to_string(isa) << " " << to_string(dtype) << " " << to_string(op) << " element " << i
                                                << ": a=0x" << hex(a.data() + i * element, element) << " b=0x"
                                                << hex(b.data() + i * element, element) << " want 0x"
                                                << hex(want.data(), element) << " got 0x" << hex(got, element));
            ++compared;
          }
        }
      }
    }
  }
  MESSAGE(compared << " elements compared with the rules");
}

TEST_CASE("IDIST_REDUCE_ISA: auto picks the widest variant, a missing one falls back with a warning, others are refused") {
  const auto widest = detail::widest_reduce_isa();
  CHECK(detail::cpu_has(widest));
  CHECK(detail::choose_reduce_isa(nullptr).isa == widest);
  CHECK(detail::choose_reduce_isa("").isa == widest);
  CHECK(detail::choose_reduce_isa("auto").isa == widest);
  for (auto isa : detail::kReduceIsas) {
    const auto name = std::string(detail::to_string(isa));
    const auto choice = detail::choose_reduce_isa(name.c_str());
    if (detail::cpu_has(isa)) {
      CHECK(choice.isa == isa);
      CHECK(choice.warning.empty());
    } else {
      CHECK(choice.isa == widest);
      CHECK(choice.warning.find("IDIST_REDUCE_ISA=" + name) != std::string::npos);
      CHECK_THROWS_AS(detail::reduce_kernel(DType::float32, ReduceOp::SUM, isa), detail::InStepError);
    }
  }
  CHECK_THROWS_WITH_AS(detail::choose_reduce_isa("sse9"),
                       doctest::Contains("IDIST_REDUCE_ISA=sse9: not one of auto, baseline, avx2, avx512"),
                       detail::InStepError);
  // The process's own choice is the one its environment asks for (ctest runs this with each).
  const char* env = std::getenv("IDIST_REDUCE_ISA");
  CHECK(detail::reduce_isa() == detail::choose_reduce_isa(env).isa);
  MESSAGE("this process reduces at " << detail::to_string(detail::reduce_isa()) << " (IDIST_REDUCE_ISA="
                                     << std::string(env == nullptr ? "unset" : env) << ")");
}
