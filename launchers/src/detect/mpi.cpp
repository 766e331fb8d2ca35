// mpirun/mpiexec of Open MPI, PMIx launchers (prterun, srun --mpi=pmix), MPICH's Hydra and
// Intel MPI, and MVAPICH: one rank per process, named by each launcher's own variables. None
// of them says which node a rank is on (Open MPI's OMPI_COMM_WORLD_NODE_RANK is a rank among
// the node's processes, not a node index) nor where rank 0 runs.
#include "detectors.hpp"
#include "parse_whole.hpp"

namespace idist::launchers::detectors {

std::optional<Reading> read_mpi(const MpiFlavor& flavor, const Vars& vars) {
  if (!vars.text(flavor.rank)) return std::nullopt;
  const std::string because = std::string(flavor.rank) + " is";
  Reading r;
  r.launcher = "mpi";
  r.source = std::string(flavor.source);
  r.rank = vars.required(flavor.rank, because);
  r.world_size = vars.integer(flavor.size, 1);
  r.local_rank = vars.integer(flavor.local_rank);
  r.local_world_size = vars.integer(flavor.local_size, 1);
  if (!flavor.nnodes.empty()) r.nnodes = vars.integer(flavor.nnodes, 1);
  r.size_variables = std::string(flavor.size);
  r.size_optional = !flavor.exports_size;
  r.local_variables = std::string(flavor.local_rank) + "/" + std::string(flavor.local_size);
  for (auto name : flavor.job_id) {
    if (name.empty()) continue;
    if (auto id = vars.text(name)) {
      r.job_id = *id;
      r.job_id_from = std::string(name);
      break;
    }
  }
  return r;
}

}  // namespace idist::launchers::detectors

namespace idist::launchers::detectors {
namespace {

// PMI_PORT's "host:port" (the host may be an IPv6 literal with colons: the port is after the last one).
PmiEndpoint port_endpoint(const Vars& vars, const std::string& text) {
  const auto colon = text.rfind(':');
  const auto port = colon == std::string::npos ? std::nullopt : parse_whole<int>(std::string_view(text).substr(colon + 1));
  if (colon == 0 || !port || *port < 1 || *port > 65535)
    vars.fail("PMI_PORT='" + text + "' is not HOST:PORT");
  PmiEndpoint e;
  e.host = text.substr(0, colon);
  if (e.host.size() > 2 && e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
  e.port = *port;
  return e;
}

}  // namespace

std::optional<Reading> read_hydra(const Vars& vars) {
  const auto fd = vars.text("PMI_FD");
  const auto port = vars.text("PMI_PORT");
  if (!vars.text("PMI_RANK") && !fd && !port && !vars.text("PMI_ID")) return std::nullopt;
  Reading r;
  r.launcher = "mpi";
  r.source = "MPICH/Intel MPI";
  r.rank = vars.integer("PMI_RANK");
  r.world_size = vars.integer("PMI_SIZE", 1);
  r.local_rank = vars.integer("MPI_LOCALRANKID");
  r.local_world_size = vars.integer("MPI_LOCALNRANKS", 1);
  r.rank_variables = "PMI_RANK";
  r.size_variables = "PMI_SIZE";
  r.local_variables = "MPI_LOCALRANKID/MPI_LOCALNRANKS";
  if (fd) {
    PmiEndpoint e;
    e.fd = vars.integer("PMI_FD")->value;
    e.from = "PMI_FD=" + *fd;
    r.pmi = e;
  } else if (port) {
    auto e = port_endpoint(vars, *port);
    e.id = vars.required("PMI_ID", "PMI_PORT is").value;
    e.from = "PMI_PORT=" + *port + " PMI_ID=" + std::to_string(e.id);
    r.pmi = e;
  } else if (vars.text("PMI_ID")) {
    vars.fail("PMI_ID is set but PMI_PORT is not: cannot reach mpiexec's PMI server for the rank and size");
  } else if (!r.rank) {
    vars.fail("PMI_RANK is not set");
  }
  return r;
}

}  // namespace idist::launchers::detectors
