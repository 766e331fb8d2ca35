#pragma once
// The tuning variables that move a measured threshold (IDIST_UCX_RING_FROM,
// IDIST_HIER_SEGMENT, IDIST_HIER_RAILS_FROM), read the one way: a decimal byte count, or
// nothing where the variable is unset, empty or not a whole number (the caller's measured
// default then stands).

#include <cstddef>
#include <cstdlib>
#include <optional>

namespace idist::detail {

inline std::optional<std::size_t> tuning_bytes(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const auto value = std::strtoull(text, &end, 10);
  if (*end != '\0') return std::nullopt;
  return static_cast<std::size_t>(value);
}

}  // namespace idist::detail
