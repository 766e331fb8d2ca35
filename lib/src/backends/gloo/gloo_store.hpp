#pragma once
// Gloo bootstraps from a gloo::rendezvous::Store; this adapts ours. Written against the 2022
// store API that Debian ships (Store&, no v2 methods to override).

#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "store/store.hpp"

namespace idist::detail {

class GlooStore final : public gloo::rendezvous::Store {
 public:
  using Clock = std::chrono::steady_clock;

  // Every wait ends by `deadline`, whatever timeout gloo passes.
  GlooStore(detail::Store& store, Clock::time_point deadline) : store_(store), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(key, data);
    got_[key] = data;  // our own addresses too (gloo_backend.cpp, accepted_peers())
  }
  // Gloo requires get() to block until the key exists; ours does, bounded by the timeout.
  // What it set and got is kept: every rank's addresses, so that an error naming an address
  // can name the rank behind it (gloo_backend.cpp, peer_ranks()).
  std::vector<char> get(const std::string& key) override {
    auto value = store_.get(key);
    got_[key] = value;
    return value;
  }
  const std::map<std::string, std::vector<char>>& got() const { return got_; }
  void wait(const std::vector<std::string>& keys) override { wait_named(keys); }
  // Gloo passes its context's timeout, which the backend shortens while connecting (the pairs'
  // connect waits are 5x it): the deadline given at construction is what bounds the wait.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait_named(keys); }

 private:
  // Gloo waits for a peer's key "<prefix><rank>": a timeout names the rank, not the key.
  // (It waits for one key at a time.)
  void wait_named(const std::vector<std::string>& keys) {
    try {
      store_.wait(keys, left());
    } catch (const TimeoutFailure& e) {
      if (keys.size() != 1) throw;
      const auto slash = keys.front().rfind('/');
      throw TimeoutFailure("rank " + keys.front().substr(slash == std::string::npos ? 0 : slash + 1) +
                           " did not publish its address to connect to: stopped, or still starting? (" + e.what() +
                           ")");
    }
  }

  std::chrono::milliseconds left() const {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()));
  }

  detail::Store& store_;
  Clock::time_point deadline_;
  std::map<std::string, std::vector<char>> got_;
};

}  // namespace idist::detail
