#pragma once
// Gloo bootstraps from a gloo::rendezvous::Store; this adapts ours. Written against the 2022
// store API that Debian ships (Store&, no v2 methods to override).

#include <gloo/rendezvous/store.h>

#include "store/store.hpp"

namespace idist::detail {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(detail::Store& store) : store_(store) {}

  void set(const std::string& key, const std::vector<char>& data) override { store_.set(key, data); }
  // Gloo requires get() to block until the key exists; ours does, bounded by the timeout.
  std::vector<char> get(const std::string& key) override { return store_.get(key); }
  void wait(const std::vector<std::string>& keys) override { store_.wait(keys, store_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_.wait(keys, timeout);
  }

 private:
  detail::Store& store_;
};

}  // namespace idist::detail
