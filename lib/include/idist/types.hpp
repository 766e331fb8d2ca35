#pragma once
// Element types and reduction operators of the public API. Backends see only (void*, count,
// DType, ReduceOp); the typed templates in idist.hpp map C++ types onto these.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "idist/export.hpp"

namespace idist {

// IEEE 754 half precision and bfloat16, as 16 bits. C++20 has no such type (std::float16_t
// is C++23), so these are storage types: arithmetic goes through float, and every backend
// reduces them as floats (widen, reduce, round to nearest even), never as integers.
struct IDIST_API float16 {
  std::uint16_t bits = 0;
  float16() = default;
  explicit float16(float value);
  explicit operator float() const;
  friend bool operator==(float16 a, float16 b) { return a.bits == b.bits; }
};

struct IDIST_API bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float value) {
    const auto u = std::bit_cast<std::uint32_t>(value);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a (quiet) NaN
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);
    } else {
      bits = static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
  explicit operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }
  friend bool operator==(bfloat16 a, bfloat16 b) { return a.bits == b.bits; }
};

enum class DType : std::uint8_t { int8, uint8, int32, int64, float16, bfloat16, float32, float64 };

// AND, OR and XOR are bitwise and defined on the integer dtypes only. AVG is torch's
// ReduceOp.AVG: the SUM divided by the group's size, on the floating dtypes only (an integer
// average would be rounded); a 16-bit float's sum is rounded once, then divided.
enum class ReduceOp : std::uint8_t { SUM, PRODUCT, MIN, MAX, AND, OR, XOR, AVG };

// The C++ types a collective accepts as elements.
template <class T>
concept Element = std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t> ||
                  std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
                  std::is_same_v<T, float16> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float> ||
                  std::is_same_v<T, double>;

template <Element T>
inline constexpr DType dtype_of = std::is_same_v<T, std::int8_t>    ? DType::int8
                                  : std::is_same_v<T, std::uint8_t> ? DType::uint8
                                  : std::is_same_v<T, std::int32_t> ? DType::int32
                                  : std::is_same_v<T, std::int64_t> ? DType::int64
                                  : std::is_same_v<T, float16>      ? DType::float16
                                  : std::is_same_v<T, bfloat16>     ? DType::bfloat16
                                  : std::is_same_v<T, float>        ? DType::float32
                                                                    : DType::float64;

IDIST_API std::size_t dtype_size(DType dtype);
IDIST_API bool is_integer(DType dtype);
IDIST_API bool is_bitwise(ReduceOp op);
IDIST_API std::string_view to_string(DType dtype);
IDIST_API std::string_view to_string(ReduceOp op);

// A buffer whose element type is known only at run time: what a rank that does not know
// the type receives from broadcast(..., {.safe_mode = true}).
struct IDIST_API Tensor {
  DType dtype = DType::uint8;
  std::vector<std::byte> bytes;

  template <Element T>
  static Tensor of(std::span<const T> values) {
    Tensor t{dtype_of<T>, std::vector<std::byte>(values.size_bytes())};
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), values.size_bytes());
    return t;
  }
  template <Element T>
  static Tensor of(const std::vector<T>& values) {
    return of(std::span<const T>(values));
  }
  std::size_t count() const { return bytes.size() / dtype_size(dtype); }
  // The elements as T; throws idist::Error "Tensor::as(...): the tensor holds D, not T" when
  // T is not this tensor's dtype.
  template <Element T>
  std::vector<T> as() const {
    check_dtype(dtype_of<T>);
    std::vector<T> out(count());
    if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }

 private:
  void check_dtype(DType wanted) const;
};

}  // namespace idist
