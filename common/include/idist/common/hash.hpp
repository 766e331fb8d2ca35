#pragma once
// FNV-1a, 64 bits: the same value for the same text in every process and on every host
// (std::hash promises neither), for ports and tokens derived from a job id and for tags
// derived from a group's name.

#include <cstdint>
#include <string_view>

namespace idist::common {

constexpr std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace idist::common
