#pragma once
// The env contract: the variables every rank sees. It is the one piece that idist-run
// (launchers/) and libidist share; nothing else crosses between them. The names are the
// ones torch.distributed's env://, DeepSpeed and Lightning read, so a Python script runs
// under idist-run unchanged.

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idist::env {

// Each variable's name, declared once.
inline constexpr std::string_view kRank = "RANK";                        // global rank
inline constexpr std::string_view kWorldSize = "WORLD_SIZE";             // number of ranks in the job
inline constexpr std::string_view kLocalRank = "LOCAL_RANK";             // rank among this node's processes
inline constexpr std::string_view kLocalWorldSize = "LOCAL_WORLD_SIZE";  // processes on this node
inline constexpr std::string_view kNodeRank = "NODE_RANK";               // index of this node
inline constexpr std::string_view kGroupRank = "GROUP_RANK";             // torchrun's spelling of NODE_RANK
inline constexpr std::string_view kGroupWorldSize = "GROUP_WORLD_SIZE";  // number of nodes (torchrun's spelling)
inline constexpr std::string_view kMasterAddr = "MASTER_ADDR";           // host where rank 0 runs the store
inline constexpr std::string_view kMasterPort = "MASTER_PORT";           // port of that store
inline constexpr std::string_view kBackend = "IDIST_BACKEND";            // gloo | nccl | mpi, chosen by the launcher
inline constexpr std::string_view kLauncher = "IDIST_LAUNCHER";          // spawn | slurm | mpi | horovod | env
inline constexpr std::string_view kRunId = "IDIST_RUN_ID";               // identity of this job
inline constexpr std::string_view kRestartCount = "IDIST_RESTART_COUNT"; // attempt number, 0 first
inline constexpr std::string_view kJobToken = "IDIST_JOB_TOKEN";         // secret every store client presents
inline constexpr std::string_view kTimeout = "IDIST_TIMEOUT";            // seconds, rendezvous and collectives
inline constexpr std::string_view kOmpNumThreads = "OMP_NUM_THREADS";    // set by the launcher only when unset
inline constexpr std::string_view kStoreBindAll = "IDIST_STORE_BIND_ALL";  // 1: rank 0's store listens on every interface
inline constexpr std::string_view kDebug = "IDIST_DEBUG";                // 1: check collectives agree across ranks
inline constexpr std::string_view kGlooSocketIfname = "GLOO_SOCKET_IFNAME";  // interface gloo binds (as in torch)
inline constexpr std::string_view kIntranode = "IDIST_INTRANODE";  // auto | shm | off: shared memory among a host's ranks
inline constexpr std::string_view kInterhost = "IDIST_INTERHOST";  // auto | ucx | gloo: what carries traffic between hosts
// What IDIST_INTERHOST=auto picks (said by --dry-run; the ranks decide it at init).
inline constexpr std::string_view kInterhostAuto =
    "ucx where every host's ranks load the ucx plugin (libidist-backend-ucx) and UCX finds a transport, else gloo";
// 1: the library says its choices (the transport between hosts) in one line; idist-run -v sets it.
inline constexpr std::string_view kVerbose = "IDIST_VERBOSE";
// The descriptor of the rank's flight recorder (idist/common/flight_recorder.hpp), which its
// idist-run made and reads; the library writes there when it is set, else in memory of its own.
inline constexpr std::string_view kRecorderFd = "IDIST_RECORDER_FD";
// Live recovery (issue 46): host:port of the store idist-run hosts for the job's generations,
// where a rank that lost a peer (idist::reform) hears which ranks go on. Unset: no recovery.
inline constexpr std::string_view kRecoveryStore = "IDIST_RECOVERY_STORE";
// There, idist-run announces generation g (1 after the first loss) at this key, as
// "members=0,2,3": the ranks that go on by their origin (the generation-0 rank, or a
// replacement's own number), in their new order. "members=0,2,3,4;grow": nobody was lost, and
// a replacement (origin 4) waits to join: the members admit it at a step boundary they agree on.
inline std::string generation_key(unsigned long long g) { return "idist/recovery/" + std::to_string(g); }
inline constexpr std::string_view kGrowTag = ";grow";
// On etcd, where each node's idist-run hosts its own ranks' store, a generation's word names
// the one its world connects through: "members=0,2,3;store=HOST:PORT".
inline constexpr std::string_view kStoreTag = ";store=";
// And each member of generation g says there that it joined it (connected its world), by its
// generation-0 rank: a member that ends without joining left the loss unrecovered.
inline std::string joined_key(unsigned long long g, int origin) {
  return generation_key(g) + "/joined/" + std::to_string(origin);
}
// And a rank whose program ended (exit 0) while others ran is not a loss: idist-run says so
// here, so that a survivor in reform() for it raises at once rather than wait.
inline std::string ended_key(int origin) { return "idist/recovery/ended/" + std::to_string(origin); }
// A rank idist-run started in a lost one's place: "ORIGIN@G", its origin (beyond every rank of
// generation 0) and the generation announced when it started. Its init() joins the running job
// in the first generation after G that has it, through the generation store (not MASTER_ADDR).
inline constexpr std::string_view kReplacement = "IDIST_REPLACEMENT";
// 0: nothing is recorded (to measure what recording costs); 1, the default: always on.
inline constexpr std::string_view kFlightRecorder = "IDIST_FLIGHT_RECORDER";
// Whether the rank's waits yield the processor rather than spin: auto (the default: where the
// job's ranks on this machine outnumber its cores), 1 or 0.
inline constexpr std::string_view kCpusShared = "IDIST_CPUS_SHARED";
// Byte counts that move a measured threshold (docs/BENCHMARKS.md), to measure it again on
// other hardware; unset, the measured default stands.
inline constexpr std::string_view kUcxRingFrom = "IDIST_UCX_RING_FROM";      // ucx all_reduce by ring from here
inline constexpr std::string_view kUcxTcpFrom = "IDIST_UCX_TCP_FROM";        // ucx's TCP lanes from here; off: never
inline constexpr std::string_view kHierSegment = "IDIST_HIER_SEGMENT";       // hierarchical segment size; 0: none
inline constexpr std::string_view kHierRailsFrom = "IDIST_HIER_RAILS_FROM";  // hierarchical rails from here; 0: never

inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::seconds(300);

// The backends idist knows, as IDIST_BACKEND, idist-run --backend and init() name them
// (whether this build has each is the library's registry's to say).
inline constexpr std::string_view kBackendNames[] = {"gloo", "nccl", "mpi"};
bool is_backend_name(std::string_view name);
std::string backend_choices();  // "gloo, nccl or mpi", for messages

// A missing or malformed variable. The message names the variable and its value.
class ContractError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Everything a rank learns from its environment.
struct Contract {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: no store (a world of one)
  std::string backend;  // empty: the program's choice (gloo by default)
  std::string launcher;
  std::string run_id;
  int restart_count = 0;
  std::string job_token;  // empty: the store accepts any client
  std::chrono::milliseconds timeout = kDefaultTimeout;
  std::string gloo_socket_ifname;
  // IDIST_INTRANODE: "auto" (shared memory wherever every rank of the job shares one host),
  // "shm" (required: an error when they do not), "off" (gloo over TCP even on one host).
  std::string intranode = "auto";
  // IDIST_INTERHOST: what carries a gloo job's traffic between hosts (among host leaders, and
  // in groups with one rank per host): "auto" (ucx where its plugin loads and UCX can run on
  // every member, else gloo), "ucx" (required: an error naming why when it cannot), "gloo".
  std::string interhost = "auto";
  bool debug = false;
  bool flight_recorder = true;  // IDIST_FLIGHT_RECORDER
  std::string cpus_shared = "auto";  // IDIST_CPUS_SHARED: "auto", "1" or "0"
  bool store_bind_all = false;
  std::string recovery_host;  // IDIST_RECOVERY_STORE; empty: idist-run offers no recovery
  int recovery_port = 0;
  int replacement_origin = -1;              // IDIST_REPLACEMENT; -1: not a replacement
  unsigned long long replacement_after = 0;  // the generation it started after
  // The thresholds above (kUcxRingFrom, ...), as given; std::nullopt where unset. Both ends of
  // a message follow them, so init() refuses a job whose ranks see different values.
  struct Tuning {
    std::optional<std::size_t> ucx_ring_from;
    std::optional<std::size_t> ucx_tcp_from;  // kNever for "off"
    std::optional<std::size_t> hier_segment;
    std::optional<std::size_t> hier_rails_from;
    static constexpr std::size_t kNever = ~std::size_t{0};
  } tuning;
  bool from_env = false;  // false when no topology variable was set: a world of one
  // With no topology set: an outer launcher's marks that describe a job of several tasks
  // ("PMI_SIZE=3 (...)"), which init() refuses unless the backend reads its own world (mpi).
  std::string unread_launcher;
};

// Looks a variable up; std::nullopt when unset. Injected so tests need not touch the process env.
using Lookup = std::function<std::optional<std::string>(std::string_view name)>;

// getenv(), treating unset as std::nullopt.
Lookup process_env();

// Reads and validates the contract. With none of RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT set, returns a world of one. Throws
// ContractError naming the first variable that is missing or malformed.
Contract read_contract(const Lookup& lookup = process_env());

// The variables a launcher exports for one rank, in a stable order. Optional values that are
// empty (backend, token, run id) or the default (timeout) are left out so the rank's own
// choice, or what it inherits, stands.
std::vector<std::pair<std::string, std::string>> to_variables(const Contract& contract);

// Variables that only an outer launcher sets, with the variable that holds its job's size
// where the environment has one. A process that carries one of them but no topology was
// started by that launcher without idist-run: taken as a world of one, every task would
// compute alone and exit 0, so idist-run and init() refuse instead.
struct LauncherMark {
  std::string_view variable;
  std::string_view size;      // "": the size lives in the launcher's server, not the environment
  std::string_view launcher;  // for messages
};
inline constexpr LauncherMark kLauncherMarks[] = {
    {"SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "srun"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun"},
    {"PMIX_RANK", "", "a PMIx launcher"},
    {"PMI_RANK", "PMI_SIZE", "MPICH/Intel MPI's mpiexec"},
    {"PMI_FD", "PMI_SIZE", "MPICH/Intel MPI's mpiexec"},
    {"PMI_ID", "", "mpiexec -pmi-port"},
    {"PMI_PORT", "", "mpiexec -pmi-port"},
    {"MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MVAPICH"},
    {"HOROVOD_RANK", "HOROVOD_SIZE", "horovodrun"},
};

// The marks present, as "PMI_ID=0 (mpiexec -pmi-port)"; empty when there are none.
std::vector<std::string> launcher_marks(const Lookup& lookup = process_env());

// Whether the marks present describe a job of more than one task: a size above 1, or marks
// whose launcher keeps the size to itself. False without marks, or when a size says 1.
bool marks_describe_a_job(const Lookup& lookup = process_env());

// Every yes/no variable of idist's (IDIST_DEBUG, IDIST_STORE_BIND_ALL, idist-run's
// IDIST_VERBOSE, IDIST_NO_DETECT, ...): 1/true/yes or 0/false/no, any case, or empty (no).
// Anything else is a ContractError naming the variable and its value.
bool parse_flag(std::string_view name, std::string_view value);

// Parses IDIST_TIMEOUT's format (seconds, fractions allowed, > 0); throws ContractError.
std::chrono::milliseconds parse_timeout(std::string_view name, std::string_view value);

}  // namespace idist::env
