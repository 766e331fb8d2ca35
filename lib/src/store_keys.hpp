#pragma once
// How the runtime reads the world's keys in rank 0's store: numbered keys per rank, asked for
// in slices the wire takes, and the pace of a wait on them. Shared by runtime.cpp (the join,
// timeouts, monitored_barrier) and runtime_finalize.cpp (finalize and departures).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/wait.hpp"
#include "store/store.hpp"

namespace idist::detail::store_keys {

using Clock = std::chrono::steady_clock;

inline constexpr const char* kWorldPrefix = "idist/world/";

// Live recovery, in the store idist-run hosts (env::generation_key): the prefix under which
// generation g's world keeps its keys.
inline std::string generation_prefix(std::uint64_t g) { return "idist/g" + std::to_string(g) + "/"; }

// The store takes at most wire::kMaxKeys keys per request; a world can have more ranks.
inline constexpr std::size_t kKeysPerRequest = 1 << 16;

// Asking the store: every 20 ms, the policy for every wait on a store key (common/wait.hpp).
inline constexpr BackoffPolicy kStorePolicy{.spin = {}, .yield = {}, .nap = std::chrono::milliseconds(20)};

inline std::chrono::milliseconds remaining(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

inline std::vector<std::string> numbered_keys(const std::string& prefix, int count) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) keys.push_back(prefix + std::to_string(i));
  return keys;
}

inline void wait_all(Store& store, const std::vector<std::string>& keys, Clock::time_point deadline) {
  for (std::size_t i = 0; i < keys.size(); i += kKeysPerRequest) {
    const auto end = keys.begin() + static_cast<long>(std::min(keys.size(), i + kKeysPerRequest));
    store.wait({keys.begin() + static_cast<long>(i), end}, remaining(deadline));
  }
}

inline std::vector<bool> check_all(Store& store, const std::vector<std::string>& keys) {
  std::vector<bool> present;
  for (std::size_t i = 0; i < keys.size(); i += kKeysPerRequest) {
    const auto end = keys.begin() + static_cast<long>(std::min(keys.size(), i + kKeysPerRequest));
    const auto part = store.check({keys.begin() + static_cast<long>(i), end});
    present.insert(present.end(), part.begin(), part.end());
  }
  return present;
}

inline std::size_t count_missing(const std::vector<bool>& present) {
  return static_cast<std::size_t>(std::count(present.begin(), present.end(), false));
}

}  // namespace idist::detail::store_keys
