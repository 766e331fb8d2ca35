#pragma once
// The strict integer reading every launcher input goes through: the whole text, decimal,
// nothing before or after it.

#include <charconv>
#include <optional>
#include <string_view>

namespace idist::launchers {

// `text` as an Int; nullopt when it is empty, holds anything besides the number, or does not fit.
template <class Int>
std::optional<Int> parse_whole(std::string_view text) {
  Int value{};
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

}  // namespace idist::launchers
