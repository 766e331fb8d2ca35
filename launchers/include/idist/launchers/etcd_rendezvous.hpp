#pragma once
// The rendezvous on etcd (--rdzv-backend etcd): the same decisions as the built-in one
// (rendezvous.hpp: attempts, MIN:MAX, one restart budget, joins during a run, one verdict for
// every node), kept in an etcd cluster rather than in node 0's idist-run, so that losing any
// node costs an attempt, not the job. See launchers/src/rendezvous/etcd/coordinator.cpp for
// the keys and the protocol.

#include <chrono>
#include <memory>
#include <string>

#include "idist/launchers/coordinator.hpp"

namespace idist::launchers {

struct EtcdRendezvousOptions {
  std::string endpoints;  // "host:port,host:port": etcd's client URLs
  std::string prefix = "/idist/rdzv/";  // --rdzv-conf prefix=...; the job's keys go under prefix + id + "/"
  std::string job_id;                   // --rdzv-id; empty: a hash of `token` (a secret: not itself a key)
  std::string token;
  std::string user;                     // etcd auth
  std::string password;
  // TLS (--rdzv-conf protocol=https, or https:// endpoints): the members checked against
  // `cacert` (PEM; empty: the system's CAs); `cert` and `key`: this node's client certificate.
  // Given a cacert, cert or key, TLS is on.
  bool https = false;
  std::string cacert, cert, key;
  std::string local_addr;  // this node's address for MASTER_ADDR (default: its address towards etcd)
  int min_nodes = 1;
  int max_nodes = 1;
  int nproc = 1;
  int max_restarts = 0;
  std::chrono::milliseconds last_call{2000};
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds dead_after{5000};  // node_timeout: the lease's TTL (whole seconds, at least 2)
  std::chrono::milliseconds join_timeout{300000};
  std::chrono::milliseconds grace{5000};
  std::chrono::milliseconds stall_timeout{0};  // --stall-timeout: job-wide stall reports (0: none)
  // Live recovery (--recovery auto): each node hosts its ranks' generations store, and a lost
  // rank or node, node 0 included, is re-formed without while the world stays >= min_world.
  bool recovery = false;
  int min_world = 1;
};

// The first of etcd's endpoints ("h1:2379,h2:2379"), as HOST:PORT; throws std::invalid_argument
// naming one that is not HOST:PORT.
std::string etcd_first_endpoint(const std::string& endpoints);

// Throws std::invalid_argument, in words for the user, where idist-run was built without the etcd
// rendezvous (cmake -DIDIST_WITH_ETCD=OFF, as scripts/demo.sh builds it).
void require_etcd_built();

class EtcdRendezvous final : public Coordinator {
 public:
  // Throws std::invalid_argument for endpoints that are not HOST:PORT, and TLS files that
  // cannot be used (naming them).
  explicit EtcdRendezvous(EtcdRendezvousOptions options);
  ~EtcdRendezvous() override;
  EtcdRendezvous(const EtcdRendezvous&) = delete;
  EtcdRendezvous& operator=(const EtcdRendezvous&) = delete;

  // Its master_addr is always set: the host of the attempt's node 0, where rank 0 runs.
  const Assignment& assignment() const override;

  void start(boost::asio::io_context& io, Events events) override;
  void join(int attempt, std::function<void(const std::optional<RemoteVerdict>& ended)> joined) override;
  int attempt() const override { return assignment().attempt; }
  void failed(int attempt, const LocalFailure& failure) override;
  void over(int attempt, const std::optional<LocalFailure>& failure,
            std::function<void(const RemoteVerdict&)> verdict) override;
  void finish(const std::string& outcome, std::function<void()> done) override;
  void stalled(int attempt) override;
  void capable(int attempt, bool admits) override;
  void ended(int attempt, int rank) override;
  void admit(int attempt, int origin, const std::string& why) override;
  bool grants_replacements() const override;
  void detach() override;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace idist::launchers
