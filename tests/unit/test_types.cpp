// The 16-bit float types and the reduction kernels every backend borrows from: conversions
// bit-exact against IEEE 754 (every one of the 65536 patterns round-trips), rounding to
// nearest even, and 16-bit floats reduced as floats, never as the integers they are stored in.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "idist/errors.hpp"
#include "idist/types.hpp"
#include "in_step_error.hpp"
#include "reduce/kernels.hpp"

using namespace idist;

TEST_CASE("float16: known values, rounding to nearest even, overflow, subnormals") {
  CHECK(float16(1.0f).bits == 0x3c00);
  CHECK(float16(-2.0f).bits == 0xc000);
  CHECK(float16(65504.0f).bits == 0x7bff);                 // the largest half
  CHECK(float16(65519.0f).bits == 0x7bff);                 // still rounds down to it
  CHECK(float16(65520.0f).bits == 0x7c00);                 // rounds up to infinity
  CHECK(float16(std::ldexp(1.0f, -24)).bits == 0x0001);    // the smallest subnormal
  CHECK(float16(std::ldexp(1.0f, -25)).bits == 0x0000);    // a tie: to even, zero
  CHECK(float16(std::ldexp(3.0f, -26)).bits == 0x0001);    // above the tie: up
  CHECK(float16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);       // tie between 1 and 1+2^-10: even
  CHECK(float16(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);       // tie between odd and even: even
  CHECK(std::isnan(static_cast<float>(float16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(static_cast<float>(float16(0.333251953125f)) == 0.333251953125f);
}

TEST_CASE("float16 and bfloat16: every bit pattern survives a round trip through float") {
  int mismatches = 0;
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    float16 h;
    h.bits = static_cast<std::uint16_t>(b);
    bfloat16 g;
    g.bits = static_cast<std::uint16_t>(b);
    const float hf = static_cast<float>(h);
    const float gf = static_cast<float>(g);
    if (!std::isnan(hf) && float16(hf).bits != h.bits) ++mismatches;
    if (!std::isnan(gf) && bfloat16(gf).bits != g.bits) ++mismatches;
    if (std::isnan(hf) != (((b >> 10) & 0x1f) == 0x1f && (b & 0x3ff) != 0)) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("bfloat16: known values and rounding") {
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(bfloat16(3.0f).bits == 0x4040);
  CHECK(bfloat16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);   // a tie: to even
  CHECK(bfloat16(1.0f + std::ldexp(3.0f, -8)).bits == 0x3f82);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("kernels: 16-bit floats reduce as floats") {
  using detail::reduce_kernel;
  // As integers, 1.0 + 1.0 would be 0x3c00 + 0x3c00 = 0x7800 (32768.0).
  std::vector<float16> a = {float16(1.0f), float16(0.5f), float16(-3.0f)};
  std::vector<float16> b = {float16(1.0f), float16(0.25f), float16(2.0f)};
  std::vector<float16> out(3);
  reduce_kernel(DType::float16, ReduceOp::SUM)(out.data(), a.data(), b.data(), 3);
  CHECK(static_cast<float>(out[0]) == 2.0f);
  CHECK(static_cast<float>(out[1]) == 0.75f);
  CHECK(static_cast<float>(out[2]) == -1.0f);
  reduce_kernel(DType::float16, ReduceOp::MIN)(out.data(), a.data(), b.data(), 3);
  CHECK(static_cast<float>(out[2]) == -3.0f);  // as unsigned integers, -3.0 (0xc200) would be the max
  std::vector<bfloat16> x = {bfloat16(3.0f)}, y = {bfloat16(-0.5f)}, z(1);
  reduce_kernel(DType::bfloat16, ReduceOp::PRODUCT)(z.data(), x.data(), y.data(), 1);
  CHECK(static_cast<float>(z[0]) == -1.5f);
}

TEST_CASE("kernels: bitwise ops on integers; on floats a clear error") {
  using detail::reduce_kernel;
  std::vector<std::int32_t> a = {0b1100, -1}, b = {0b1010, 5}, out(2);
  reduce_kernel(DType::int32, ReduceOp::AND)(out.data(), a.data(), b.data(), 2);
  CHECK(out == std::vector<std::int32_t>{0b1000, 5});
  reduce_kernel(DType::int32, ReduceOp::OR)(out.data(), a.data(), b.data(), 2);
  CHECK(out == std::vector<std::int32_t>{0b1110, -1});
  reduce_kernel(DType::int32, ReduceOp::XOR)(out.data(), a.data(), b.data(), 2);
  CHECK(out == std::vector<std::int32_t>{0b0110, ~5});
  std::vector<std::uint8_t> u = {200}, v = {100}, w(1);
  reduce_kernel(DType::uint8, ReduceOp::SUM)(w.data(), u.data(), v.data(), 1);
  CHECK(w[0] == 44);  // wraps, as the integer type does
  // InStepError: ProcessGroup turns it into idist::Error and keeps the group usable.
  CHECK_THROWS_WITH_AS(reduce_kernel(DType::float32, ReduceOp::XOR), "XOR is defined on integer dtypes only, not float32",
                       detail::InStepError);
  CHECK_THROWS_AS(reduce_kernel(DType::bfloat16, ReduceOp::AND), detail::InStepError);
}

TEST_CASE("Tensor: typed views check the dtype") {
  const auto t = Tensor::of(std::vector<std::int64_t>{1, -2, 3});
  CHECK(t.dtype == DType::int64);
  CHECK(t.count() == 3);
  CHECK(t.as<std::int64_t>() == std::vector<std::int64_t>{1, -2, 3});
  CHECK_THROWS_WITH_AS((void)t.as<float>(), "[idist rank 0/1] Tensor::as: the tensor holds int64, not float32", Error);
}
