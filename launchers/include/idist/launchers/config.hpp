#pragma once
// idist-run's settings from outside its command line: an IDIST_<OPTION> variable for every
// option, torchrun's own PET_<OPTION> for every option torchrun has (so that a pod spec or job
// script written for torchrun works with idist-run in its place), and a JSON launch profile
// (--config FILE.json). The command line wins over IDIST_*, which wins over PET_*, which wins
// over the file; what an outer launcher says (a PyTorchJob pod's RANK/WORLD_SIZE, detect.hpp)
// fills only what all of these leave unset.
//
// CLI11's own config and env support is not used: CLI11 2.x reads the config file before the
// environment and lets a variable fill only an option nothing else set, so a file would beat
// the environment. idist-run instead parses its command line alone, then gives every option
// the command line left unset its value from here, as the text the option would have had on
// the command line. The option then converts and checks it exactly as it checks its command
// line, and an error names where the value came from (see Value::context).

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "idist/env_contract.hpp"

namespace idist::launchers {
struct RendezvousOptions;
struct EtcdRendezvousOptions;
}  // namespace idist::launchers

namespace idist::launchers::config {

// count_or_auto: an integer, or the string "auto" (-n auto); count_or_range: an integer, or
// "MIN:MAX" (--nnodes).
enum class Type { integer, count_or_auto, count_or_range, number, string, boolean };

// The values of idist-run's options as the command line gives them (text where idist-run
// checks the value itself, after the environment and a config file have had their say). Each
// member's initializer is the option's default.
struct Options {
  std::optional<std::string> nproc_per_node;
  std::optional<std::string> nnodes;
  std::optional<int> node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  std::optional<std::string> rdzv_id;
  std::optional<std::string> rdzv_endpoint;
  std::string rdzv_conf;
  std::string rdzv_backend = "c10d";
  std::string port_range = "20000-32767";
  std::string launcher = "auto";
  bool force_spawn = false;
  bool dry_run = false;
  std::string backend;
  bool tag_output = false;
  double grace_seconds = 5;
  double stall_seconds = 60;
  double heartbeat_seconds = 3;
  std::string recovery = "auto";
  int min_world = 1;
  std::string stall_action = "report";
  std::optional<std::string> timeout_seconds;
  int max_restarts = 0;
  std::string forward_signals = "USR1,USR2";
  std::string log_dir;
  std::string metrics;
  double straggler_percent = 10;
  std::string trace;
  bool verbose = false;
  bool module = false;          // -m: the program is a Python module
  bool no_python = false;       // --no-python: a .py program runs directly
  bool bind = false;            // --bind/--no-bind; neither (the option unset): bind where the ranks fit
  bool keep_slurm_env = false;  // spawned ranks keep their SLURM task's variables
  bool local_rank_arg = false;  // each rank's arguments get --local_rank=N
};

// Where an option's value goes: a flag is a bool member, every other option one of the rest.
using Target = std::variant<bool Options::*, int Options::*, double Options::*, std::string Options::*,
                            std::optional<int> Options::*, std::optional<std::string> Options::*>;

// What the command line checks of a value beyond its type, as it parses it (idist-run turns
// each into a CLI11 check); the rest idist-run checks once every source has been read.
enum class Check { none, port, node_rank, launcher, backend, grace, stall_timeout, stall_action, restarts, heartbeat_timeout, recovery, min_world, percent };

// One option of idist-run, declared once: its spellings, help, default (the Options member's
// initializer) and where its value goes. idist-run's command line, --help and its man page,
// the config keys (--print-config-keys, the schema's test) and the variables all come from here.
struct Setting {
  std::string_view key;     // in a config file: the long option without "--", '_' for '-' ('-' also accepted)
  std::string_view option;  // the long option on the command line
  std::string_view env;     // the variable
  Type type;                // the JSON type a config file gives it
  std::string_view also;    // its other spellings on the command line, CLI11's way: "-n,--nproc_per_node"
  std::string_view help;    // for --help
  Target target;            // where the command line puts its value
  Check check = Check::none;
  bool show_default = false;  // --help shows the default
  bool secret = false;        // shown as "<hidden>" by --print-config and --dry-run (it is the store's password)
  bool unset_decides = false;  // a flag whose absence is a choice of its own (--bind/--no-bind): unset, not false
};

// Every option idist-run has, but --config, --print-config(-keys), --status, --help and
// --version, which are actions rather than settings. The variables are IDIST_ and the option
// in capitals except where that name already means something else to the ranks a job starts
// (the env contract): IDIST_TIMEOUT is each collective's timeout, not the job's, and
// IDIST_LAUNCHER tells a rank where its topology came from; a nested idist-run must not take
// either for its own option.
inline constexpr Setting kSettings[] = {
    {"nproc_per_node", "--nproc-per-node", "IDIST_NPROC_PER_NODE", Type::count_or_auto, "-n,--nproc_per_node",
     "Ranks to start on this node (1 to 4096, or auto: one per visible GPU, else one per usable core; default 1, or "
     "one rank per task of an outer launcher)",
     &Options::nproc_per_node},
    {"nnodes", "--nnodes", "IDIST_NNODES", Type::count_or_range, "",
     "Nodes in a job without a scheduler: N, or MIN:MAX (elastic); with --rdzv-endpoint or --master-addr",
     &Options::nnodes},
    {"node_rank", "--node-rank", "IDIST_NODE_RANK", Type::integer, "--node_rank",
     "This node's index, 0 to --nnodes - 1 (optional with a rendezvous: nodes are ranked by host name)",
     &Options::node_rank, Check::node_rank},
    {"master_addr", "--master-addr", "IDIST_MASTER_ADDR", Type::string, "--master_addr",
     "Address of rank 0's store (default: 127.0.0.1, or what the outer launcher says)", &Options::master_addr},
    {"master_port", "--master-port", "IDIST_MASTER_PORT", Type::integer, "--master_port",
     "Port of rank 0's store (default: a free one, or one derived from the job's id)", &Options::master_port,
     Check::port},
    {"rdzv_id", "--rdzv-id", "IDIST_RDZV_ID", Type::string, "--rdzv_id",
     "The job's identity, the same on every node (as torchrun's): rank 0's port is derived from it where no "
     "launcher gives a job id, and only clients presenting it reach the store (needed by --nnodes > 1 unless "
     "IDIST_JOB_TOKEN is set)",
     &Options::rdzv_id, Check::none, false, true},
    {"rdzv_endpoint", "--rdzv-endpoint", "IDIST_RDZV_ENDPOINT", Type::string, "--rdzv_endpoint",
     "HOST[:PORT] (default port 29400) where the nodes meet, the same on every node: the first idist-run started "
     "on HOST hosts it and is node 0 (rank 0 runs there)",
     &Options::rdzv_endpoint},
    {"rdzv_conf", "--rdzv-conf", "IDIST_RDZV_CONF", Type::string, "--rdzv_conf",
     "key=seconds,...: join_timeout (default IDIST_TIMEOUT), last_call_timeout (2), heartbeat (1), node_timeout "
     "(5: a node silent that long ends the attempt)",
     &Options::rdzv_conf},
    {"rdzv_backend", "--rdzv-backend", "IDIST_RDZV_BACKEND", Type::string, "--rdzv_backend",
     "Where the nodes' rendezvous lives: c10d (or static; default): in node 0's idist-run; etcd (or etcd-v2): in "
     "an etcd cluster, --rdzv-endpoint HOST:PORT[,HOST:PORT...] its members, so that no node's loss ends the job "
     "(--rdzv-conf prefix=, user=, password=, local_addr=)",
     &Options::rdzv_backend, Check::none, true},
    {"port_range", "--port-range", "IDIST_PORT_RANGE", Type::string, "",
     "Range that ports derived from a job's id fall in (LO-HI)", &Options::port_range, Check::none, true},
    {"launcher", "--launcher", "IDIST_LAUNCHER_KIND", Type::string, "",
     "Where the job's topology comes from (auto detects)", &Options::launcher, Check::launcher, true},
    {"force_spawn", "--force-spawn", "IDIST_FORCE_SPAWN", Type::boolean, "",
     "Start -n ranks per task even when the outer launcher already runs several tasks on this node",
     &Options::force_spawn},
    {"dry_run", "--dry-run", "IDIST_DRY_RUN", Type::boolean, "", "Print the launch plan as JSON and start nothing",
     &Options::dry_run},
    {"backend", "--backend", "IDIST_BACKEND", Type::string, "",
     "Backend every rank uses, overriding the program's choice", &Options::backend, Check::backend},
    {"tag_output", "--tag-output", "IDIST_TAG_OUTPUT", Type::boolean, "", "Prefix each output line with [rank N]",
     &Options::tag_output},
    {"grace", "--grace", "IDIST_GRACE", Type::number, "", "Seconds between SIGTERM and SIGKILL when stopping ranks",
     &Options::grace_seconds, Check::grace, true},
    {"stall_timeout", "--stall-timeout", "IDIST_STALL_TIMEOUT", Type::number, "",
     "Seconds a rank may wait in one collective before idist-run reports who is stuck where (0: never)",
     &Options::stall_seconds, Check::stall_timeout, true},
    {"stall_action", "--stall-action", "IDIST_STALL_ACTION", Type::string, "",
     "After a stall report: report (and keep waiting) or kill (end the attempt as a failure: restarts apply, exit "
     "1)",
     &Options::stall_action, Check::stall_action, true},
    {"heartbeat_timeout", "--heartbeat-timeout", "IDIST_HEARTBEAT_TIMEOUT", Type::number, "",
     "Seconds a rank that beats a heartbeat (idist::InitOptions::recovery) may go without one before idist-run "
     "stops it as frozen (SIGKILL) and says so (0: never; else at least 1)",
     &Options::heartbeat_seconds, Check::heartbeat_timeout, true},
    {"recovery", "--recovery", "IDIST_RECOVERY", Type::string, "",
     "auto: when a rank is lost (killed, crashed, frozen) and every other rank opted in (InitOptions::recovery), "
     "the survivors go on in their processes (idist::reform) instead of the attempt ending (spawn mode, on one node "
     "or several; on the built-in rendezvous node 0 must stay, on etcd any node may go); off: never",
     &Options::recovery, Check::recovery, true},
    {"min_world", "--min-world", "IDIST_MIN_WORLD", Type::integer, "",
     "With --recovery auto: the fewest ranks the job may go on with after a loss; below it the attempt ends as "
     "after any failure (default 1; over several nodes, node 0's)",
     &Options::min_world, Check::min_world, true},
    {"timeout", "--timeout", "IDIST_JOB_TIMEOUT", Type::number, "",
     "Seconds the whole job may run (every attempt); then it is stopped and idist-run exits 124 (variable: "
     "IDIST_JOB_TIMEOUT; IDIST_TIMEOUT is each collective's)",
     &Options::timeout_seconds},
    {"max_restarts", "--max-restarts", "IDIST_MAX_RESTARTS", Type::integer, "--max_restarts",
     "Restart every local rank after a failure, up to this many times (spawn mode; see below)",
     &Options::max_restarts, Check::restarts, true},
    {"forward_signals", "--forward-signals", "IDIST_FORWARD_SIGNALS", Type::string, "",
     "Signals passed on to every rank while the job goes on (comma-separated: HUP, INT, QUIT, TERM, USR1, USR2, "
     "ALRM, WINCH, or none); the others of these but WINCH stop the job",
     &Options::forward_signals, Check::none, true},
    {"log_dir", "--log-dir", "IDIST_LOG_DIR", Type::string, "--log_dir",
     "Also write each rank's stdout and stderr to DIR/<run-id>/attempt_<k>/rank_<r>.{out,err}, and "
     "DIR/<run-id>/summary.json at the end",
     &Options::log_dir},
    {"metrics", "--metrics", "IDIST_METRICS", Type::string, "",
     "[HOST:]PORT: serve this node's ranks' metrics at http://HOST:PORT/metrics for Prometheus (calls, bytes and "
     "time by op and backend, time between calls, steps, cpu, memory, state; labels job, node, host, rank)",
     &Options::metrics},
    {"straggler_threshold", "--straggler-threshold", "IDIST_STRAGGLER_THRESHOLD", Type::number, "",
     "Percent by which a rank's work between collectives (per step, where the program marks steps) may exceed "
     "the other ranks' median before idist-run names it a straggler, once per episode (0: never)",
     &Options::straggler_percent, Check::percent, true},
    {"trace", "--trace", "IDIST_TRACE", Type::string, "",
     "FILE: at the job's end, write the ranks' collectives (op, bytes, start and end, who waited for whom) to FILE "
     "as a Chrome/Perfetto trace, one track per rank (open it in ui.perfetto.dev)",
     &Options::trace},
    {"verbose", "--verbose", "IDIST_VERBOSE", Type::boolean, "-v", "Say what idist-run decides and does",
     &Options::verbose},
    {"module", "--module", "IDIST_MODULE", Type::boolean, "-m",
     "The program is a Python module: run python3 -u -m MODULE ARGS... (as torchrun -m)", &Options::module},
    {"no_python", "--no-python", "IDIST_NO_PYTHON", Type::boolean, "--no_python",
     "Run a .py program directly (it needs #! and +x) rather than under python3 -u (as torchrun --no-python)",
     &Options::no_python},
    {"bind", "--bind", "IDIST_BIND", Type::boolean, "!--no-bind",
     "Pin each spawned rank to its share of the usable cores (whole cores, whole NUMA nodes where the counts "
     "allow) and set OMP_NUM_THREADS to match, unless it is set. Default: bound where every rank gets a cpu of "
     "its own and nobody bound idist-run (its affinity mask is all its cgroup or machine has), leaving out the "
     "cpus other idist-run jobs here bound ranks to; --bind binds whatever the mask and count, --no-bind (IDIST_BIND=0) never; -v and --dry-run say which and why",
     &Options::bind, Check::none, false, false, true},
    {"keep_slurm_env", "--keep-slurm-env", "IDIST_KEEP_SLURM_ENV", Type::boolean, "",
     "Ranks spawned inside a SLURM task keep the task's SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, ... (by default "
     "each gets those srun would have given it as a task of its own)",
     &Options::keep_slurm_env},
    {"local_rank_arg", "--local-rank-arg", "IDIST_LOCAL_RANK_ARG", Type::boolean, "",
     "Append --local_rank=N (the rank's LOCAL_RANK) to each rank's arguments, as torch.distributed.launch without "
     "--use-env and DeepSpeed's launcher do, for scripts that read it with argparse (after the script when the "
     "program is python3)",
     &Options::local_rank_arg},
};

// What --print-config and --dry-run show instead of a secret setting's value (and the token).
inline constexpr std::string_view kHidden = "<hidden>";

inline constexpr std::string_view kConfigOption = "--config";
inline constexpr std::string_view kConfigEnv = "IDIST_CONFIG";  // the file, when --config is not given
inline constexpr std::string_view kProgramKey = "program";      // the program and its arguments (file only)
inline constexpr std::string_view kSchemaKey = "$schema";       // ignored: lets editors find the schema

// A value from the environment or a config file.
struct Value {
  std::string text;     // as the option would take it on the command line
  std::string from;     // where it came from, for --dry-run: "IDIST_GRACE", "grace in job.json"
  std::string context;  // what errors start with: "IDIST_GRACE='x'", "job.json: key 'grace'"
};

// A config file, its keys checked and its values type-checked; ranges are the options' to check.
struct File {
  std::string path;
  std::map<std::string, Value, std::less<>> values;  // by Setting::key
  std::vector<std::string> program;                  // "program": the program and its arguments, or empty

  // What errors about `key`'s value start with: "job.json: key 'program'".
  std::string context(std::string_view key) const;
  // Where `key`'s value came from, for --dry-run: "program in job.json".
  std::string from(std::string_view key) const;
};

// Reads `path`: a JSON object of known keys, each of its setting's type, no setting twice.
// `named_by` says who named the file ("--config 'job.json'", "IDIST_CONFIG='job.json'") for
// errors about the file as a whole. Throws UsageError (one line, naming the file and the key).
File read_file(const std::string& path, const std::string& named_by);

// `setting`'s value from its variable (IDIST_*), else from torchrun's (PET_*, where torchrun
// has the option); nullopt when both are unset. An empty one is refused (empty_value). A flag's
// variable takes 1/true/yes or 0/false/no; anything else is a UsageError naming the variable. PET_NPROC_PER_NODE's gpu and
// cpu become the count they stand for.
std::optional<Value> from_env(const Setting& setting, const env::Lookup& lookup = env::process_env());

// torchrun's variable for `setting` ("PET_RDZV_ID"), or nullopt where torchrun has no such
// option. torchrun's argparse `env` action reads PET_ + the option's dest in capitals
// (torch/distributed/argparse_util.py), and its dests are our keys.
std::optional<std::string> torchrun_variable(const Setting& setting);

// torchrun's -n: a count, or "auto" (one per visible GPU, else one per usable core), "gpu"
// (one per visible GPU: an error without one) or "cpu" (one per usable core), as
// torch/distributed/run.py takes them. `context` starts the error ("PET_NPROC_PER_NODE='abc'").
int torchrun_nproc_per_node(std::string_view text, std::string_view context);

// torchrun's --rdzv-backend (PET_RDZV_BACKEND, which a PyTorchJob's elasticPolicy sets) as
// idist-run's rendezvous: c10d (and static) are the built-in one, "c10d" here. The one place
// this mapping is made. Anything else is a UsageError naming `variable`.
std::string torchrun_rdzv_backend(std::string_view variable, std::string_view value);

// The one rule for an empty value, wherever idist-run reads one (a variable, an option, a
// config key, a --rdzv-conf key): refused, naming it. Taken as unset, it would quietly change
// the job (PET_RDZV_ID='' ran a PyTorchJob's pods with no secret). `name`: "PET_RDZV_ID",
// "--rdzv-id", "--rdzv-conf prefix"; `wants`: "the job's id". A variable's words say to unset
// it ("PET_RDZV_ID is set but empty: unset it or give the job's id"), an option's to leave it
// out.
std::string empty_value(std::string_view name, std::string_view wants);
// Throws UsageError(empty_value(name, wants)) when `value` is empty.
void refuse_empty(std::string_view name, std::string_view value, std::string_view wants);
// What `setting` wants, for empty_value: "the job's id", "HOST:PORT", "a directory".
std::string_view wanted(const Setting& setting);

// The one reading of a number of seconds for every duration option (--timeout, --grace,
// --stall-timeout, --rdzv-conf's join_timeout and the others): a finite number in `range`.
// Throws UsageError whose text starts with the value, for the caller to put its option before
// ("--rdzv-conf join_timeout=" + "1e9 is too large: at most 1000000 s"), each case in its own
// words: not a number, too small, too large (with the limit).
struct SecondsRange {
  double min = 0;
  bool min_exclusive = true;  // above `min`, rather than at least
  double max = 1e6;
};
double parse_seconds(std::string_view text, SecondsRange range = {});

// --rdzv-conf key=value,...: torchrun's join_timeout and last_call_timeout, and ours,
// heartbeat (how often agents and rendezvous beat) and node_timeout (silence that drops a
// node), in seconds. With --rdzv-backend etcd (`etcd` given) also etcd's keys, whose values are
// text: prefix (of the job's keys), user and password (etcd's auth), local_addr (this node's
// MASTER_ADDR when its node hosts rank 0), and TLS as torchrun's etcd rendezvous names it:
// protocol=https, cacert, cert and key (PEM files). Throws UsageError naming the key.
void parse_rdzv_conf(const std::string& text, RendezvousOptions& r, EtcdRendezvousOptions* etcd = nullptr);

// A yes/no variable, as env::parse_flag reads every one; its error as a UsageError.
bool parse_env_flag(std::string_view name, std::string_view value);

// IDIST_NO_DETECT=1: no outer launcher is looked for (idist-run, idist::spawn alike).
inline constexpr std::string_view kNoDetectEnv = "IDIST_NO_DETECT";
bool no_detect_from_env(const env::Lookup& lookup = env::process_env());

// Every key a config file may hold, sorted: each setting's key in both spellings, "program"
// and "$schema". The schema (config/idist-run.schema.json) lists exactly these.
std::vector<std::string> accepted_keys();

// The table for --help: option, variable and key of every setting.
std::string help_table();

// One setting's resolved value, for --dry-run.
struct Resolved {
  const Setting* setting = nullptr;
  std::optional<std::string> text;  // nullopt: unset (the option has no default)
  std::string from;                 // "--grace", "IDIST_GRACE", "grace in job.json", "default"
};

// --print-config: every setting's effective value and where it came from, one per line
// ("grace  30  IDIST_GRACE"), then the program.
std::string effective_table(const std::vector<Resolved>& settings, const std::vector<std::string>& program,
                            std::string_view program_from);

// --dry-run's plan (dry_run_json's output) with two objects added: `settings`, every value set
// (defaults included), typed as a config file types it, and `settings_from`, where each came
// from (`program_from` for the program). The options that `provenance` names are replaced by
// the variable or key that gave their value.
std::string add_settings(const std::string& plan_json, const std::vector<Resolved>& settings,
                         std::string_view program_from);

}  // namespace idist::launchers::config
