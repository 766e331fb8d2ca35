#pragma once
// What the detectors share: a reader for launcher variables that names them in its errors, and
// the Reading each detector returns: only what its own variables say. detect.cpp checks that
// readings agree and completes the winner (derived node index, one-node defaults).

#include <array>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idist/launchers/detect.hpp"
#include "idist/launchers/pmi.hpp"

namespace idist::launchers::detectors {

struct Reading {
  std::string launcher;  // slurm | mpi | horovod | env
  std::string source;    // "SLURM step", "Open MPI", ...
  std::optional<Sourced<int>> rank, world_size, local_rank, local_world_size, node_rank, nnodes;
  std::optional<Sourced<std::string>> master_addr;
  std::optional<Sourced<int>> master_port;
  std::vector<std::string> hosts;
  std::vector<int> tasks_per_node;
  std::string job_id;
  std::uint64_t step = 0;
  std::string job_id_from;
  std::string run_id;  // job_id plus the step where there is one ("5.0")
  // For the messages when the winner lacks a value: the variables that would have given it.
  std::string rank_variables;
  std::string size_variables;
  std::string local_variables;
  bool one_node_by_default = false;  // torch's rule: without LOCAL_* every rank is on one node
  bool size_optional = false;        // the launcher never exports a size: without one, not a winner
  std::optional<PmiEndpoint> pmi;    // Hydra: a PMI server that knows the job's name (and rank and size)
};

// Reads launcher variables for one source; every error names the variable, its value and the source.
class Vars {
 public:
  Vars(const env::Lookup& lookup, std::string source) : lookup_(lookup), source_(std::move(source)) {}

  std::optional<std::string> text(std::string_view name) const { return lookup_(name); }

  // A non-negative integer (at least `min`), or nullopt when unset.
  std::optional<Sourced<int>> integer(std::string_view name, int min = 0) const;
  // The first of `names` that is set.
  std::optional<Sourced<int>> first_integer(std::initializer_list<std::string_view> names, int min = 0) const;
  // A TCP port (1 to 65535), or nullopt when unset.
  std::optional<Sourced<int>> port(std::string_view name) const;
  // Like integer(), but a missing variable is an error saying that `because` is set.
  Sourced<int> required(std::string_view name, std::string_view because, int min = 0) const;

  [[noreturn]] void fail(const std::string& what) const;

 private:
  const env::Lookup& lookup_;
  std::string source_;
};

// MASTER_ADDR and MASTER_PORT as exported to the job: torchrun sets them, and a job script may
// (Lightning reads them too). They say where rank 0 is, over whatever the launcher implies.
void read_exported_master(const Vars& vars, Reading& r);

std::optional<Reading> read_slurm(const Vars& vars, std::vector<std::string>& notes);

// The MPI launchers differ only in their variables' names.
struct MpiFlavor {
  std::string_view source;
  std::string_view rank, size, local_rank, local_size;
  std::string_view nnodes;                         // empty when the launcher does not say
  bool exports_size;                               // PMIx keeps the size in its server, not the env
  std::array<std::string_view, 2> job_id;          // variables shared by every rank of the job ("": none)
};
inline constexpr MpiFlavor kOpenMpi{"Open MPI",
                                    "OMPI_COMM_WORLD_RANK",
                                    "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK",
                                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                                    "OMPI_MCA_orte_num_nodes",
                                    true,
                                    {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}};
inline constexpr MpiFlavor kPmix{"PMIx", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE", "", false,
                                 {"PMIX_NAMESPACE"}};
inline constexpr MpiFlavor kMvapich{"MVAPICH",
                                    "MV2_COMM_WORLD_RANK",
                                    "MV2_COMM_WORLD_SIZE",
                                    "MV2_COMM_WORLD_LOCAL_RANK",
                                    "MV2_COMM_WORLD_LOCAL_SIZE",
                                    "",
                                    true,
                                    {"", ""}};

std::optional<Reading> read_mpi(const MpiFlavor& flavor, const Vars& vars);
// MPICH's and Intel MPI's Hydra: PMI_RANK/PMI_SIZE and PMI_FD, or (mpiexec -pmi-port) only
// PMI_PORT and PMI_ID; the job's name, and then rank and size, are the PMI server's.
std::optional<Reading> read_hydra(const Vars& vars);
std::optional<Reading> read_horovod(const Vars& vars);
std::optional<Reading> read_torch_env(const Vars& vars);

}  // namespace idist::launchers::detectors
