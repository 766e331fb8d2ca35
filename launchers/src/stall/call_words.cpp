#include "call_words.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/fmt/ranges.h>

#include <array>

#include "idist/types.hpp"

namespace idist::launchers::detail::call_words {

namespace rec = common::recorder;

namespace {

constexpr std::array<const char*, 8> kDTypeNames = {"int8",    "uint8",    "int32",   "int64",
                                                    "float16", "bfloat16", "float32", "float64"};

std::string dtype_name(std::uint8_t d) { return d < kDTypeNames.size() ? kDTypeNames[d] : "dtype " + std::to_string(d); }

// idist::to_string(ReduceOp)'s names: that function is libidist's, which idist-run does not
// link (it starts ranks, it runs no collective); the assert keeps the two from parting.
constexpr std::array<const char*, 8> kReduceNames = {"SUM", "PRODUCT", "MIN", "MAX", "AND", "OR", "XOR", "AVG"};
static_assert(kReduceNames.size() == static_cast<std::size_t>(ReduceOp::AVG) + 1, "a name for every ReduceOp");

std::string reduce_name(std::uint8_t r) { return r < kReduceNames.size() ? kReduceNames[r] : "op " + std::to_string(r); }

}  // namespace

std::string group_name(std::int32_t g) { return g < 0 ? "world" : "new_group #" + std::to_string(g); }

std::string seconds(std::int64_t ns) { return fmt::format("{:.1f} s", static_cast<double>(ns) / 1e9); }

std::string details(const Recorded& r, bool with_sum) {
  if (r.op == "barrier") return "";
  // All ones: a count told at run time (an all_gather of each rank's own part, a broadcast
  // whose size goes first).
  std::string out = dtype_name(r.dtype);
  if ((r.reduce != 0 || with_sum) && r.op.find("reduce") != std::string::npos) out += " " + reduce_name(r.reduce);
  out += r.count != ~std::uint64_t{0} ? fmt::format(", {} element{}", r.count, r.count == 1 ? "" : "s")
         : r.op == "all_gather"       ? ", each rank's own count"
                                      : ", its count sent first";
  if (r.root >= 0) out += fmt::format(", root {}", r.root);
  return out;
}

std::string what(const Recorded& r, bool with_sum) {
  const auto d = details(r, with_sum);
  return d.empty() ? r.op : r.op + " (" + d + ")";
}

bool collective(const Recorded& s) { return s.kind == rec::Kind::collective; }

bool same_call(const Recorded& a, const Recorded& b) {
  return a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root && a.reduce == b.reduce;
}

std::string list(const std::vector<int>& ranks) {
  return fmt::format("rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ", "));
}

}  // namespace idist::launchers::detail::call_words
