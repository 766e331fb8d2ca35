#pragma once
// Which instruction set the reduction kernels (reduce/kernels.hpp) run at. The library is built
// for the compiler's default target (x86-64: SSE2, 128-bit vectors); the kernels are compiled
// again for AVX2 and AVX-512, and the widest this CPU has is chosen once per process, at the
// first reduction. IDIST_REDUCE_ISA forces one, to measure or test each.

#include <cstdint>
#include <string>
#include <string_view>

namespace idist::detail {

enum class ReduceIsa : std::uint8_t { baseline, avx2, avx512 };
inline constexpr ReduceIsa kReduceIsas[] = {ReduceIsa::baseline, ReduceIsa::avx2, ReduceIsa::avx512};

// auto (the default: the widest this CPU has) | baseline | avx2 | avx512. A variant this CPU
// lacks falls back to the widest it has, with a one-line warning on stderr (a job's environment
// reaches every host, and a host without AVX-512 must not fail where the others run); any
// other value is refused: every reduction throws InStepError naming the variable.
// Not in the env contract: the launcher neither sets nor reads it.
inline constexpr std::string_view kReduceIsaVariable = "IDIST_REDUCE_ISA";

std::string_view to_string(ReduceIsa isa);

// Whether this CPU (and the OS, which must save the wider registers) runs the variant: baseline
// always; avx2 with AVX2; avx512 with AVX-512 F, BW, VL and DQ (bytes and int64 products in
// 512-bit registers). Always false off x86 or off GCC and Clang, where only baseline is built.
bool cpu_has(ReduceIsa isa);

// The widest variant cpu_has.
ReduceIsa widest_reduce_isa();

// What a value of IDIST_REDUCE_ISA selects on this CPU (null or empty: auto), and the warning
// to print when it had to fall back; throws InStepError for a value it does not know.
struct IsaChoice {
  ReduceIsa isa = ReduceIsa::baseline;
  std::string warning;  // empty: none
};
IsaChoice choose_reduce_isa(const char* value);

// The process's variant: IDIST_REDUCE_ISA read once, the warning printed once. Rethrows the
// InStepError of a value it does not know at every call (nothing is chosen then).
ReduceIsa reduce_isa();

}  // namespace idist::detail
