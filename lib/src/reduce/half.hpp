#pragma once
// IEEE binary16 <-> binary32, inline: float16's conversions (types.hpp) and the reduction
// kernels' scalar loops are these, so that a kernel's loop has no call per element and the
// compiler may vectorise it. Rounding to nearest even, with subnormals and infinities; a NaN
// becomes the quiet NaN 0x7e00 with its sign (its payload dropped), and a half NaN widens with
// its payload as it is (a signalling one stays signalling). The F16C variant
// (reduce/kernels.cpp) gives the same bits.
// Branch-free (masks, which vectorise as blends), after Fabian Giesen's half_to_float_fast
// and float_to_half_fast3_rtne: the float adder does the subnormal cases' shifting and
// rounding, which is exact or correctly rounded in the default rounding mode.

#include <bit>
#include <cstdint>

namespace idist::detail {

inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t shifted = static_cast<std::uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa
  const std::uint32_t exponent = shifted & (0x7c00u << 13);
  const std::uint32_t rebiased = shifted + ((127u - 15u) << 23);
  // Zero or subnormal: 2^-14 * (1 + m/1024), less the implicit 2^-14, is exactly m * 2^-24.
  const float small = std::bit_cast<float>(rebiased + (1u << 23)) - std::bit_cast<float>(113u << 23);
  // Masks rather than ?:, so that the float subtraction is plainly done for every element: a
  // compiler keeps a floating operation that might trap out of a select, and the loop scalar.
  const std::uint32_t special = 0u - static_cast<std::uint32_t>(exponent == (0x7c00u << 13));  // infinity, NaN
  const std::uint32_t subnormal = 0u - static_cast<std::uint32_t>(exponent == 0);
  const std::uint32_t u = (special & (rebiased + ((128u - 16u) << 23))) |
                          (subnormal & std::bit_cast<std::uint32_t>(small)) | (~(special | subnormal) & rebiased);
  return std::bit_cast<float>(u | sign);
}

inline std::uint16_t float_to_half(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;
  // At least 65536 (2^16): infinity, or the quiet NaN.
  const std::uint16_t huge = abs > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // Below 2^-14, a subnormal half or zero: adding 0.5 puts the half's mantissa, rounded to
  // nearest even, in the low bits of the float.
  const std::uint32_t magic = 126u << 23;
  const auto tiny = static_cast<std::uint16_t>(
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(abs) + std::bit_cast<float>(magic)) - magic);
  // A normal half: rebias, and round to nearest even by adding just under half an ulp plus the
  // kept mantissa's lowest bit (a carry into the exponent rounds 65520 and up to infinity).
  const std::uint32_t rounded = abs + ((15u - 127u) << 23) + 0xfffu + ((abs >> 13) & 1u);
  const auto normal = static_cast<std::uint16_t>(rounded >> 13);
  const std::uint16_t is_huge = static_cast<std::uint16_t>(0u - static_cast<std::uint32_t>(abs >= 0x47800000u));
  const std::uint16_t is_tiny = static_cast<std::uint16_t>(0u - static_cast<std::uint32_t>(abs < 0x38800000u));
  const auto half = static_cast<std::uint16_t>((is_huge & huge) | (is_tiny & tiny) |
                                               (static_cast<std::uint16_t>(~(is_huge | is_tiny)) & normal));
  return static_cast<std::uint16_t>(half | sign);
}

}  // namespace idist::detail
