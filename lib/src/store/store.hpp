#pragma once
// The key-value store every rank bootstraps from (c10d's Store, reduced to what we use).
// Rank 0 serves it over TCP; gloo builds its mesh from it; later, groups take key prefixes.

#include <charconv>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "idist/export.hpp"

namespace idist::detail {

// Raised by stores and backends when a deadline passes; the API boundary turns it into
// idist::TimeoutError with rank, op and backend. Exported: plugins throw it.
class IDIST_API TimeoutFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// add() on a stored value: counters are kept as decimal text, as c10d does, so that get() of
// a counter is readable. Throws std::invalid_argument when the value is not an integer and
// std::out_of_range when the sum does not fit (any client may send any delta: no UB here).
inline std::int64_t add_to_counter(std::vector<char>& slot, std::int64_t delta) {
  std::int64_t value = 0;
  if (!slot.empty()) {
    const char* end = slot.data() + slot.size();
    const auto [ptr, ec] = std::from_chars(slot.data(), end, value);
    if (ec != std::errc() || ptr != end) throw std::invalid_argument("the value is not an integer");
  }
  if (__builtin_add_overflow(value, delta, &value)) throw std::out_of_range("the counter would overflow");
  const auto text = std::to_string(value);
  slot.assign(text.begin(), text.end());
  return value;
}

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  // Blocks until the key exists; TimeoutFailure after timeout().
  virtual std::vector<char> get(const std::string& key) = 0;
  // Adds delta to the integer at key (0 when absent) and returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Blocks until every key exists; TimeoutFailure after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // Which of `keys` exist now, without waiting.
  virtual std::vector<bool> check(const std::vector<std::string>& keys) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

}  // namespace idist::detail
