#pragma once
// An in-process store: the bootstrap for a world of one, and for threads-as-ranks tests where
// several ranks live in one process.

#include <condition_variable>
#include <map>
#include <mutex>

#include "store/store.hpp"

namespace idist::detail {

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::chrono::milliseconds timeout = std::chrono::seconds(300)) : timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<bool> check(const std::vector<std::string>& keys) override;
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
};

}  // namespace idist::detail
