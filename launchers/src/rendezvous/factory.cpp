// The one place that knows both rendezvous: idist-run's run() asks for "this node's part of the
// rendezvous" and gets a Coordinator whose assignment() says the attempt, whichever it is.

#include <stdexcept>

#include "idist/launchers/coordinator.hpp"
#include "idist/launchers/etcd_rendezvous.hpp"
#include "idist/launchers/rendezvous.hpp"

namespace idist::launchers {

#ifndef IDIST_WITH_ETCD
void require_etcd_built() {
  throw std::invalid_argument(
      "--rdzv-backend etcd: this idist-run was built without the etcd rendezvous (cmake -DIDIST_WITH_ETCD=OFF, as "
      "scripts/demo.sh builds it); use the build of scripts/test.sh or the package, or the built-in rendezvous "
      "(--rdzv-backend c10d)");
}

std::string etcd_first_endpoint(const std::string&) {
  require_etcd_built();
  return {};
}
#else
void require_etcd_built() {}

namespace {

// etcd's options take what both rendezvous share from the built-in one's (the plan, the budget,
// --rdzv-conf's timings, --grace); its own (endpoints, id, prefix, TLS) come set.
EtcdRendezvousOptions etcd_options(const RendezvousOptions& o, EtcdRendezvousOptions e) {
  e.token = o.token;
  e.min_nodes = o.min_nodes;
  e.max_nodes = o.max_nodes;
  e.nproc = o.nproc;
  e.max_restarts = o.max_restarts;
  e.last_call = o.last_call;
  e.heartbeat = o.heartbeat;
  e.dead_after = o.dead_after;
  e.join_timeout = o.join_timeout;
  e.grace = o.grace;
  e.stall_timeout = o.stall_timeout;
  e.recovery = o.recovery;
  e.min_world = o.min_world;
  return e;
}

}  // namespace
#endif

std::shared_ptr<Coordinator> make_coordinator(const RendezvousOptions& options, const EtcdRendezvousOptions* etcd) {
  if (!etcd) return std::make_shared<NodeAgent>(options);
#ifndef IDIST_WITH_ETCD
  require_etcd_built();
  return nullptr;
#else
  try {
    return std::make_shared<EtcdRendezvous>(etcd_options(options, *etcd));
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    // Every option of etcd's that cannot work is the user's to fix (a local_addr this host
    // cannot bind, TLS files): named as such.
    throw std::invalid_argument(e.what());
  }
#endif
}

}  // namespace idist::launchers
