// mpirun/mpiexec of Open MPI, PMIx launchers (prterun, srun --mpi=pmix), MPICH's Hydra and
// Intel MPI, and MVAPICH: one rank per process, named by each launcher's own variables. None
// of them says which node a rank is on (Open MPI's OMPI_COMM_WORLD_NODE_RANK is a rank among
// the node's processes, not a node index) nor where rank 0 runs.
#include "detectors.hpp"

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
