#pragma once
// A node's words to etcd under one key (a/K/admit/ID, a/K/lost/ID: each the whole list so far),
// one put at a time. The client sends concurrent requests on connections of their own, where
// etcd may apply them in either order, and the older list would stay: a node joining live said
// its two ranks' admission in two puts, the second landed first, and its second rank was never
// admitted. The newest value waiting replaces any older one not yet sent.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "client.hpp"

namespace idist::launchers::etcd_rdzv {

class OrderedPuts {
 public:
  // send(key, value, done): the put itself; `done` once etcd applied it.
  using Send = std::function<void(const std::string&, const etcd::Json&, std::function<void()>)>;

  explicit OrderedPuts(Send send) : send_(std::move(send)) {}

  void put(const std::string& key, etcd::Json value) {
    auto& k = keys_[key];
    if (k.in_flight) {
      k.next = std::move(value);
      return;
    }
    k.in_flight = true;
    send_(key, value, [this, key] {
      auto& k = keys_[key];
      k.in_flight = false;
      if (auto next = std::exchange(k.next, std::nullopt)) put(key, std::move(*next));
    });
  }

 private:
  struct Key {
    bool in_flight = false;
    std::optional<etcd::Json> next;
  };
  Send send_;
  std::map<std::string, Key> keys_;
};

}  // namespace idist::launchers::etcd_rdzv
