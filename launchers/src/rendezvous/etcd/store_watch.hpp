#pragma once
// A killed node costs no lease TTL under live recovery on etcd: each node's idist-run hosts its
// ranks' generations store (node_recovery.hpp), so a connection held to that store ends the
// moment the process does (the kernel closes its sockets), while a frozen node or a cut cable
// keeps it open and is found by its lease, as before. The proposer holds one to every member;
// every other node one to the proposer's node. Whoever sees one end has that node's lease
// revoked (coordinator.cpp), which ends its keys, and its election place, at once.

#include <boost/asio.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace idist::launchers::etcd_rdzv {

class StoreWatch {
 public:
  // `gone(id)`: the store of node `id` closed its connection (once per watch).
  StoreWatch(boost::asio::io_context& io, std::function<void(const std::string& id)> gone);
  ~StoreWatch();
  StoreWatch(const StoreWatch&) = delete;
  StoreWatch& operator=(const StoreWatch&) = delete;

  // Holds a connection to node `id`'s store at addr:port, presenting `token`, unless one to that
  // store is held already. A store that refuses the connection is gone; one that cannot be
  // reached, or does not take the token, is not watched (its lease decides).
  void watch(const std::string& id, const std::string& addr, int port, const std::string& token);
  // Every watch ends (a new attempt's stores are other ones).
  void clear();

 private:
  struct Held;
  void gone(const std::string& id, const std::string& key);
  void drop(const std::string& key, const std::shared_ptr<Held>& held);
  void read(const std::string& id, const std::string& key, std::weak_ptr<Held> weak);

  boost::asio::io_context& io_;
  std::function<void(const std::string&)> gone_;
  std::map<std::string, std::shared_ptr<Held>> held_;  // by "id@addr:port"
};

}  // namespace idist::launchers::etcd_rdzv
