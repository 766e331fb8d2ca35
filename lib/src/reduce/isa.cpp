#include "reduce/isa.hpp"

#include <cstdlib>

#include "in_step_error.hpp"
#include "log.hpp"

namespace idist::detail {

std::string_view to_string(ReduceIsa isa) {
  switch (isa) {
    case ReduceIsa::baseline: return "baseline";
    case ReduceIsa::avx2: return "avx2";
    case ReduceIsa::avx512: return "avx512";
  }
  return "unknown";
}

bool cpu_has(ReduceIsa isa) {
  if (isa == ReduceIsa::baseline) return true;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  // libgcc's (and compiler-rt's) detection also asks the OS, through XGETBV, whether it saves
  // the ymm and zmm registers: a feature the OS does not enable reads as absent.
  __builtin_cpu_init();
  if (isa == ReduceIsa::avx2) return __builtin_cpu_supports("avx2");
  if (isa == ReduceIsa::avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  return false;
}

ReduceIsa widest_reduce_isa() {
  ReduceIsa widest = ReduceIsa::baseline;
  for (auto isa : kReduceIsas)
    if (cpu_has(isa)) widest = isa;
  return widest;
}

IsaChoice choose_reduce_isa(const char* value) {
  const std::string_view v = value == nullptr ? "" : value;
  if (v.empty() || v == "auto") return {.isa = widest_reduce_isa(), .warning = {}};
  for (auto isa : kReduceIsas) {
    if (v != to_string(isa)) continue;
    if (cpu_has(isa)) return {.isa = isa, .warning = {}};
    const auto widest = widest_reduce_isa();
    return {.isa = widest,
            .warning = "idist: " + std::string(kReduceIsaVariable) + "=" + std::string(v) +
                       ": this CPU lacks it; the reduction kernels run at " + std::string(to_string(widest))};
  }
  throw InStepError(std::string(kReduceIsaVariable) + "=" + std::string(v) +
                    ": not one of auto, baseline, avx2, avx512");
}

ReduceIsa reduce_isa() {
  // A throwing initialiser leaves the static uninitialised: the next call tries (and throws) again.
  static const ReduceIsa chosen = [] {
    const auto choice = choose_reduce_isa(std::getenv(std::string(kReduceIsaVariable).c_str()));
    if (!choice.warning.empty()) log().warn("{}", choice.warning);
    return choice.isa;
  }();
  return chosen;
}

}  // namespace idist::detail
