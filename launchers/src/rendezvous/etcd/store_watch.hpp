#pragma once
// A killed node costs no lease TTL under live recovery on etcd: each node's idist-run hosts its
// ranks' generations store (node_recovery.hpp), so a connection held to that store ends the
// moment the process does (the kernel closes its sockets, and its port then refuses), while a
// frozen node or a cut cable keeps it open and is found by its lease, as before. The proposer
// holds one to every member; every other node one to the proposer's node. Whoever sees one end
// has that node's lease revoked (node_recovery.cpp), which ends its keys, and its election
// place, at once.

#include <boost/asio.hpp>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace idist::launchers::etcd_rdzv {

class StoreWatch {
 public:
  // `gone(id)`: the store of node `id` closed its connection, and refused another (once).
  StoreWatch(boost::asio::io_context& io, std::function<void(const std::string& id)> gone);
  ~StoreWatch();
  StoreWatch(const StoreWatch&) = delete;
  StoreWatch& operator=(const StoreWatch&) = delete;

  // Holds a connection to node `id`'s store at addr:port, presenting `token`, unless that store
  // was asked already. Gone: the connection it held ended, and the store then refused another.
  // One it cannot reach or connect to at first, or that does not take the token, is not
  // watched (its lease decides).
  void watch(const std::string& id, const std::string& addr, int port, const std::string& token);
  // Every watch ends (a new attempt's stores are other ones).
  void clear();

 private:
  struct Held;
  void connect(const std::string& id, const std::string& key, const std::shared_ptr<Held>& held, bool confirming);
  void read(const std::string& id, const std::string& key, std::weak_ptr<Held> weak, bool confirming);
  void unwatched(const std::shared_ptr<Held>& held);
  void found_gone(const std::string& id, const std::string& key);

  boost::asio::io_context& io_;
  std::function<void(const std::string&)> gone_;
  std::map<std::string, std::shared_ptr<Held>> held_;  // by "id@addr:port"
};

}  // namespace idist::launchers::etcd_rdzv
