// horovodrun in gloo mode. HOROVOD_CROSS_RANK is the index among the processes that share a
// local rank, which is the node index when nodes are filled in order.
#include "detectors.hpp"

namespace idist::launchers::detectors {

std::optional<Reading> read_horovod(const Vars& vars) {
  if (!vars.text("HOROVOD_RANK")) return std::nullopt;
  constexpr std::string_view because = "HOROVOD_RANK is";
  Reading r;
  r.launcher = "horovod";
  r.source = "horovodrun";
  r.rank = vars.required("HOROVOD_RANK", because);
  r.world_size = vars.integer("HOROVOD_SIZE", 1);
  r.size_variables = "HOROVOD_SIZE";
  r.local_rank = vars.integer("HOROVOD_LOCAL_RANK");
  r.local_world_size = vars.integer("HOROVOD_LOCAL_SIZE", 1);
  // CROSS_SIZE counts the hosts that have this local rank: the node count only when every
  // host runs as many ranks. Otherwise the node is unknown, and complete() refuses to guess.
  auto cross_rank = vars.integer("HOROVOD_CROSS_RANK");
  auto cross_size = vars.integer("HOROVOD_CROSS_SIZE", 1);
  if (cross_rank && cross_size && r.local_world_size && r.world_size &&
      static_cast<long long>(cross_size->value) * r.local_world_size->value == r.world_size->value) {
    r.node_rank = cross_rank;
    r.nnodes = cross_size;
  }
  r.local_variables = "HOROVOD_LOCAL_RANK/HOROVOD_LOCAL_SIZE";
  // The driver's rendezvous server is the same for every rank of the job.
  const auto addr = vars.text("HOROVOD_GLOO_RENDEZVOUS_ADDR");
  const auto port = vars.text("HOROVOD_GLOO_RENDEZVOUS_PORT");
  if (addr && port) {
    r.job_id = *addr + ":" + *port;
    r.job_id_from = "HOROVOD_GLOO_RENDEZVOUS_ADDR and HOROVOD_GLOO_RENDEZVOUS_PORT";
  }
  return r;
}

}  // namespace idist::launchers::detectors
