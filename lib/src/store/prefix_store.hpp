#pragma once
// A view of a store under a key prefix: live recovery's generations share the store idist-run
// hosts, and each generation's world (its gloo mesh, its joins, its finalize) keeps to
// "idist/g<g>/", so that no key of an earlier generation is ever read as a later one's.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/store.hpp"

namespace idist::detail {

class PrefixStore final : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix) : inner_(std::move(inner)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& value) override { inner_->set(prefix_ + key, value); }
  std::vector<char> get(const std::string& key) override { return inner_->get(prefix_ + key); }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return inner_->add(prefix_ + key, delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(prefixed(keys), timeout);
  }
  std::vector<bool> check(const std::vector<std::string>& keys) override { return inner_->check(prefixed(keys)); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

}  // namespace idist::detail
