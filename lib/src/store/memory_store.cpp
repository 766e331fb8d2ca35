#include "store/memory_store.hpp"

#include <algorithm>
#include <string>

namespace idist::detail {

void MemoryStore::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard lock(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

std::vector<char> MemoryStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard lock(mu_);
  return data_.at(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t value = 0;
  {
    std::lock_guard lock(mu_);
    value = add_to_counter(data_[key], delta);
  }
  cv_.notify_all();
  return value;
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const bool ok = cv_.wait_for(lock, timeout, [&] {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k) > 0; });
  });
  if (!ok) throw TimeoutFailure("store keys not set within " + std::to_string(timeout.count()) + " ms");
}

std::vector<bool> MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  std::vector<bool> present;
  for (const auto& k : keys) present.push_back(data_.count(k) > 0);
  return present;
}

}  // namespace idist::detail
