#pragma once
// Element types and reduction operators of the public API. Backends see only (void*, count,
// DType, ReduceOp); the typed templates in idist.hpp map C++ types onto these.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace idist {

enum class DType : std::uint8_t { int8, uint8, int32, int64, float32, float64 };

enum class ReduceOp : std::uint8_t { SUM, PRODUCT, MIN, MAX };

// The C++ types a collective accepts as elements.
template <class T>
concept Element = std::is_same_v<T, std::int8_t> || std::is_same_v<T, std::uint8_t> ||
                  std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
                  std::is_same_v<T, float> || std::is_same_v<T, double>;

template <Element T>
inline constexpr DType dtype_of = std::is_same_v<T, std::int8_t>    ? DType::int8
                                  : std::is_same_v<T, std::uint8_t> ? DType::uint8
                                  : std::is_same_v<T, std::int32_t> ? DType::int32
                                  : std::is_same_v<T, std::int64_t> ? DType::int64
                                  : std::is_same_v<T, float>        ? DType::float32
                                                                    : DType::float64;

std::size_t dtype_size(DType dtype);
std::string_view to_string(DType dtype);
std::string_view to_string(ReduceOp op);

}  // namespace idist
