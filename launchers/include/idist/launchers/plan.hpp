#pragma once
// The launch plan: who every process this invocation starts (or becomes) is, and what
// environment (the env contract) it gets. Made from the command line's options and what
// detect() finds, in this order:
//
//  0. A Kubeflow PyTorchJob pod (detect_pytorchjob, unless --launcher or IDIST_NO_DETECT say
//     otherwise): one node of a job as in 1, its variables filling the options left unset.
//  1. --nnodes/--node-rank/--rdzv-endpoint (a job over several nodes without a scheduler):
//     spawn -n ranks here as one node of the job. The nodes meet at a rendezvous (rendezvous.hpp)
//     that gives each attempt its node ranks, world size and rank 0's port; --node-rank, when
//     given, is kept.
//  2. An outer launcher (SLURM step, mpirun, horovodrun, torchrun env), unless --launcher
//     spawn or IDIST_NO_DETECT=1:
//       - one task per rank (no -n, or -n 1): exec the program in place with the contract set,
//         so signals and exit codes stay the outer launcher's;
//       - one task per node with -n K: spawn K ranks here; the node comes from the outer
//         launcher and global ranks are node-major. Several tasks on this node each asking for
//         -n K would multiply the job, so that is refused unless --force-spawn.
//  3. Nothing detected: spawn -n ranks on this host.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idist/env_contract.hpp"
#include "idist/launchers/cpu_claims.hpp"
#include "idist/launchers/detect.hpp"
#include "idist/launchers/ports.hpp"
#include "idist/launchers/process_spec.hpp"
#include "idist/launchers/resources.hpp"

namespace idist::launchers {

// Whether spawned ranks are pinned to cores (bind_ranks decides).
enum class Bind {
  where_fits,  // neither --bind nor --no-bind: as mpirun does, where each rank gets a core of its own
  always,      // --bind (IDIST_BIND=1): share out whatever cpus idist-run may use, one each at least
  never,       // --no-bind (IDIST_BIND=0)
};

struct LaunchOptions {
  std::optional<int> nproc_per_node;  // -n; unset: 1, or one rank per outer task
  std::optional<int> nnodes;          // several nodes without a scheduler (MAX of MIN:MAX)
  std::optional<int> min_nodes;       // MIN of --nnodes MIN:MAX
  std::optional<int> node_rank;
  std::optional<std::string> rdzv_endpoint;  // HOST[:PORT]
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  // --rdzv-id: the job's identity, the same on every node (as torchrun's). Rank 0's port is
  // derived from it where no launcher gives a job id, and the store admits only clients that
  // present it (as IDIST_JOB_TOKEN, which wins when both are set).
  std::optional<std::string> rdzv_id;
  PortRange port_range;               // where ports derived from a job id fall
  std::string backend;                // empty: the program's own choice
  std::string launcher = "auto";      // auto | spawn | slurm | mpi | horovod | env
  bool no_detect = false;             // IDIST_NO_DETECT=1
  bool force_spawn = false;           // spawn -n K even when the node already runs several tasks
  bool dry_run = false;               // reserve nothing
  Bind bind = Bind::where_fits;       // pin each spawned rank to its share of our cores
  bool keep_slurm_env = false;        // --keep-slurm-env: spawned ranks keep their task's SLURM_* values
  bool local_rank_arg = false;        // --local-rank-arg: --local_rank=N follows the program in each rank's command
  int max_restarts = 0;               // --max-restarts, for the ranks' TORCHELASTIC_MAX_RESTARTS
  std::vector<std::string> command;   // program (resolved) and its arguments
  // The program's file (resolve_program), for a look at the libraries it links; empty: not
  // looked at. An MPI program spawned as several ranks is refused (make_plan).
  std::string program_path;
  PmiClient pmi = ask_pmi_server;     // how detection asks Hydra's PMI server; tests pass a fake
};

enum class Mode { spawn, exec };

// Where the nodes of a job over several nodes meet (rendezvous.hpp).
struct RendezvousPlan {
  std::string host;  // also the ranks' MASTER_ADDR: rank 0 runs on the node that hosts it
  int port = 0;
  int min_nodes = 1;
  int max_nodes = 1;
  std::optional<int> node_rank;
  std::string token;  // the job's secret (IDIST_JOB_TOKEN or --rdzv-id)
};
inline constexpr int kDefaultRendezvousPort = 29400;  // torchrun's for --rdzv-endpoint

struct LaunchPlan {
  Mode mode = Mode::spawn;
  env::Contract job;          // job-wide values; rank and local_rank are those of the first local process
  int local_count = 1;        // processes this invocation starts (exec: itself)
  std::vector<std::string> command;
  std::vector<std::string> hosts;                 // the job's nodes where known, else this host
  std::map<std::string, std::string> provenance;  // rank, world_size, local_rank, node_rank, master_addr, master_port
  std::vector<std::string> notes;                 // what was seen and not used, and why
  std::string detected_by;                        // the detector's name, or "" in plain spawn mode
  std::vector<std::string> unset;                 // inherited variables the ranks must not see
  // Variables every rank gets unless the environment idist-run started in has them (--dry-run
  // shows them): PYTHONUNBUFFERED=1, because a rank's stdout is a pipe, through which Python
  // would hold back its output until exit (python3 without -u, as users write it).
  std::map<std::string, std::string> rank_defaults;
  std::shared_ptr<PortReservation> port_reservation;  // spawn on one node: held for the job's lifetime
  std::vector<std::vector<int>> cpu_shares;  // bound (spawn mode): local rank i's cores; else empty
  std::string binding;  // for -v and --dry-run: whether the ranks are bound, and why
  bool binding_wants_cpus = false;  // fewer cpus than ranks left free by other jobs' claims (not bound)
  bool keep_slurm_env = false;  // spawned under SLURM: leave SLURM_PROCID & co. as the task's (rank_environment)
  bool local_rank_arg = false;  // rank_command inserts --local_rank=N after the program_words
  int max_restarts = 0;         // the ranks' TORCHELASTIC_MAX_RESTARTS (rank_environment)
  std::size_t program_words = 1;  // program_words(command): "python3 -u train.py" is 3
  // A job over several nodes: the rendezvous decides node_rank, nnodes, world_size, rank and
  // master_port for each attempt (apply_assignment); until then they are placeholders.
  std::optional<RendezvousPlan> rendezvous;
};

// Throws UsageError for contradictory options, and for a program that links MPI (mpi_library)
// spawned as several ranks with no --backend other than mpi: each rank's MPI_Init would make a
// world of one, every rank doing all the work and exiting 0; mpirun must start such ranks.
// Throws DetectError for a broken environment.
LaunchPlan make_plan(const LaunchOptions& options, const env::Lookup& env = env::process_env());

// What the node looks like to bind_ranks: read from the kernel by make_plan, given by tests.
struct CpuView {
  std::vector<int> mask;      // idist-run's affinity mask (usable_cpus)
  std::vector<int> allotted;  // the cpus given to processes here before anyone binds (allotted_cpus)
  std::string allotted_source;
  std::map<int, int> numa;    // numa_node_of_cpu
  std::map<int, int> core;    // core_of_cpu
  std::vector<int> claimed;   // increasing: cpus of the mask other idist-run jobs here bound ranks to (claimed_cpus)
};
CpuView cpu_view(const env::Lookup& env = env::process_env());

// The policy of binding, for `ranks` ranks spawned here (none of it applies to exec mode, whose
// outer launcher binds its tasks): Bind::where_fits binds when every rank gets a cpu of its
// own and nobody bound idist-run already (its mask is the whole allotment); Bind::always
// shares out the mask whatever it is (two ranks on one cpu when they outnumber it);
// Bind::never does not. Bind::where_fits leaves out the cpus other idist-run jobs here claimed,
// and does not bind where the rest are too few. Fills plan.cpu_shares (empty: not bound) and
// plan.binding.
void bind_ranks(LaunchPlan& plan, Bind bind, int ranks, const CpuView& view);

// Claims the cpus of the plan's binding (CpuClaims): a job started here meanwhile leaves them
// out. Where another job claimed some since the plan looked, the binding is chosen again from a
// fresh look (plan.cpu_shares and plan.binding change). Bind::always keeps its shares and claims
// those of its cpus nobody holds, and never lets go. A default binding that found too few cpus
// free holds an UnboundMark instead, which asks the bound jobs to let go.
std::unique_ptr<HeldBinding> hold_binding(LaunchPlan& plan, Bind bind, const env::Lookup& env = env::process_env());

// Before each attempt: where `held` let go (another job here runs unbound for want of cpus),
// the plan's ranks are spawned unbound from now on.
void follow_binding(LaunchPlan& plan, HeldBinding& held);

// The contract of local process `index` (0 <= index < local_count).
env::Contract rank_contract(const LaunchPlan& plan, int index);

// The environment of local process `index`: `base_environ` with the contract's variables set
// (and OMP_NUM_THREADS only when unset: the rank's share of the cores, its --bind share when
// there is one), as "NAME=value" strings. Ranks spawned inside a SLURM step also get the
// SLURM_* task variables srun would have given them as tasks of their own (SLURM_PROCID =
// RANK, SLURM_LOCALID = LOCAL_RANK, SLURM_NTASKS = WORLD_SIZE, ...), unless keep_slurm_env.
// The plan's rank_defaults, like OMP_NUM_THREADS, are set only where unset.
std::vector<std::string> rank_environment(const LaunchPlan& plan, int index, char** base_environ);

// torchrun's worker variables that are not the contract's (TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, ROLE_NAME, ROLE_RANK, ROLE_WORLD_SIZE) for a
// rank of `plan` with contract `rank`: rank_environment sets them, --dry-run shows them.
std::vector<std::pair<std::string, std::string>> torchelastic_variables(const LaunchPlan& plan,
                                                                        const env::Contract& rank);
// The command line of local process `index`: plan.command, and with local_rank_arg
// "--local_rank=N" (N its LOCAL_RANK) between the program and its own arguments (after the
// script, when the program is a Python interpreter: program_words), where
// torch.distributed.launch without --use-env and DeepSpeed's launcher put it for scripts that
// take it from argparse (before the script's arguments, so that a "--" or a subcommand among
// them does not swallow it).
std::vector<std::string> rank_command(const LaunchPlan& plan, int index);

// Attempt `restart_count` of a spawn-mode plan: every local process runs `path` with its
// rank_command and rank_environment (and its --bind cores). A restart gets a fresh port when
// the first was one reserved here: the old one may still be held by a straggler of the failed
// attempt or sit in TIME_WAIT. A port the user or an outer launcher chose is every node's to
// agree on, so it stays.
Attempt attempt_of(LaunchPlan& plan, const std::string& path, int restart_count, char** base_environ);

// The values the rendezvous gave this node for `attempt` into plan.job. The ranks' job token
// is the job's with the attempt appended: a rank of one attempt cannot talk to the store of
// another, even on a port the two happen to share.
void apply_assignment(LaunchPlan& plan, int attempt, int node_rank, int nnodes, int world_size, int rank_base,
                      int master_port);
// That token: "JOB#ATTEMPT". The stores idist-run hosts for an attempt's generations (live
// recovery) take the same, so that a rank of another attempt is refused there too.
std::string attempt_token(const std::string& job_token, int attempt);

// Whether this host's ranks could take UCX between hosts, as far as idist-run can tell without
// starting them: the ucx plugin found where libidist looks and loaded (in a child), or why not.
struct UcxHere {
  bool loads = false;
  std::string detail = "not looked for";  // the plugin's path, or why it is not usable here
};

// --dry-run's output: one JSON object (see README, "--dry-run").
std::string dry_run_json(const LaunchPlan& plan, const UcxHere& ucx = {});

// A fresh secret for the store (128 bits from the OS's random source, hex).
std::string random_token(std::size_t bytes = 16);

}  // namespace idist::launchers
