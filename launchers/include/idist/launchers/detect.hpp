#pragma once
// Detection: what an outer launcher (srun, mpirun, horovodrun, torchrun, ...) already says
// about this process. One detector per source, tried in a fixed priority:
//
//   SLURM step > Open MPI > PMIx > MPICH/Intel MPI > MVAPICH > horovodrun > torchrun-style env
//
// (explicit flags, handled by the plan, come before all of them; local spawn after). A
// Kubeflow PyTorchJob pod (detect_pytorchjob) is a node rather than a rank: the plan asks for
// it first, and detect() leaves the pod's RANK/WORLD_SIZE to it. Every
// value keeps the variable it came from, for --dry-run and for error messages. When several
// sources are present (srun --mpi=pmi2 also sets PMI_RANK; a container hook may set RANK under
// srun) they must agree on what they both say.

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "idist/env_contract.hpp"
#include "idist/launchers/pmi.hpp"

namespace idist::launchers {

// Malformed or conflicting launcher variables. One line, naming the variables and values.
class DetectError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value and where it came from: a variable ("SLURM_PROCID"), an option ("--master-addr"),
// or a short description of how it was derived.
template <typename T>
struct Sourced {
  T value{};
  std::string from;
};

// For messages: "SLURM_PROCID=3" for a value read from a variable, "2 (how it was derived)"
// for one worked out.
std::string describe(const Sourced<int>& v);

// One process's place in a job, as an outer launcher describes it.
struct Detected {
  std::string launcher;  // slurm | mpi | horovod | env: what IDIST_LAUNCHER says
  std::string source;    // the detector: "SLURM step", "Open MPI", ...
  Sourced<int> rank, world_size, local_rank, local_world_size, node_rank, nnodes;
  std::optional<Sourced<std::string>> master_addr;  // where the environment says rank 0 runs
  std::optional<Sourced<int>> master_port;
  std::vector<std::string> hosts;           // the job's nodes, in order, where the environment lists them
  std::vector<int> tasks_per_node;          // tasks on each node, where the environment says (SLURM)
  std::string job_id;                       // the same on every rank of the job; empty when unknown
  std::uint64_t step = 0;                   // SLURM step id: steps of one job get different ports
  std::string job_id_from;                  // the variables job_id and step came from
  std::string run_id;                       // the job's (and step's) identity, for IDIST_RUN_ID; empty when unknown
  bool one_node_assumed = false;            // torch's reading of a bare RANK/WORLD_SIZE: every rank on this node
};

// A pod of a Kubeflow PyTorchJob (the training operator's variables, detect/pytorchjob.cpp):
// not a rank but one node of a job without a scheduler, as torchrun sees it there. What the
// variables say becomes the options of such a job (--nnodes, --node-rank, --master-addr,
// --rdzv-endpoint, -n) wherever the command line and the PET_* options leave them unset.
struct PodDetected {
  std::string source;                                  // "Kubeflow PyTorchJob pod (training-operator v1.7 or later)"
  std::optional<Sourced<std::string>> nproc_per_node;  // a count, or torchrun's auto | gpu | cpu
  std::optional<Sourced<int>> nnodes, min_nodes, node_rank, master_port;
  std::optional<Sourced<std::string>> master_addr, rdzv_endpoint, rdzv_id;
  std::string rdzv_backend;     // config::torchrun_rdzv_backend's answer; empty: PET_RDZV_BACKEND unset
  std::string job_name;         // the same in every pod of the job (its master's or rendezvous' address)
  std::string job_name_from;    // the variables job_name came from
  std::vector<std::string> notes;
};

struct Detection {
  std::optional<Detected> found;   // nullopt: no outer launcher; idist-run spawns locally
  std::vector<std::string> notes;  // what was seen and deliberately not used, for -v and --dry-run
  std::optional<PodDetected> pod;  // a PyTorchJob pod (--launcher auto only): a node, not a rank; `found` is empty
};

// Launcher names --launcher accepts; "auto" detects, "spawn" skips detection.
inline constexpr std::string_view kLauncherChoices[] = {"auto", "spawn", "slurm", "mpi", "horovod", "env"};

struct DetectOptions {
  // "auto" (first match wins) or one of slurm|mpi|horovod|env (only that kind may win;
  // DetectError when it finds nothing).
  std::string_view launcher = "auto";
  // Whether the job's identity is needed (to derive rank 0's port and the run id). False when
  // the user gave them (--master-port, --rdzv-id): then Hydra's PMI server is asked only for
  // what the environment lacks, and under PMI_FD not at all, which leaves PMI_FD to the program.
  bool job_id_needed = true;
  PmiClient pmi = ask_pmi_server;
};

// The pod's reading, or nullopt where no PET_* variable of the operator is set, or LOCAL_RANK
// is (a rank that torchrun or idist-run started inherits the pod's PET_*). Throws DetectError
// (one line naming the variables) for a malformed or contradictory set.
std::optional<PodDetected> detect_pytorchjob(const env::Lookup& env);

// Runs the detectors in priority order. Throws DetectError for malformed values, incomplete
// sets, sources that disagree, and an outer launcher's marks (env::launcher_marks) that no
// detector can turn into a complete topology: never a silent world of one.
Detection detect(const env::Lookup& env, const DetectOptions& options = {});

// SLURM_STEP_TASKS_PER_NODE's compressed form: "2(x3),1" -> {2, 2, 2, 1}. Throws DetectError
// naming `variable`.
std::vector<int> expand_tasks_per_node(std::string_view variable, std::string_view text);

}  // namespace idist::launchers
