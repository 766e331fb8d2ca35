#pragma once
// idist-run's settings from outside its command line: an IDIST_<OPTION> variable for every
// option (as torchrun's PET_<OPTION>) and a JSON launch profile (--config FILE.json). The
// command line wins over the environment, which wins over the file.
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
#include <vector>

#include "idist/env_contract.hpp"

namespace idist::launchers::config {

// count_or_auto: an integer, or the string "auto" (-n auto); count_or_range: an integer, or
// "MIN:MAX" (--nnodes).
enum class Type { integer, count_or_auto, count_or_range, number, string, boolean };

// One option of idist-run and its other two spellings.
struct Setting {
  std::string_view key;     // in a config file: the long option without "--", '_' for '-' ('-' also accepted)
  std::string_view option;  // the long option on the command line
  std::string_view env;     // the variable
  Type type;                // the JSON type a config file gives it
  bool secret = false;      // shown as "<hidden>" by --print-config and --dry-run (it is the store's password)
};

// Every option idist-run has, but --config itself. The variables are IDIST_ and the option in
// capitals except where that name already means something else to the ranks a job starts
// (the env contract): IDIST_TIMEOUT is each collective's timeout, not the job's, and
// IDIST_LAUNCHER tells a rank where its topology came from; a nested idist-run must not take
// either for its own option.
inline constexpr Setting kSettings[] = {
    {"nproc_per_node", "--nproc-per-node", "IDIST_NPROC_PER_NODE", Type::count_or_auto},
    {"nnodes", "--nnodes", "IDIST_NNODES", Type::count_or_range},
    {"node_rank", "--node-rank", "IDIST_NODE_RANK", Type::integer},
    {"master_addr", "--master-addr", "IDIST_MASTER_ADDR", Type::string},
    {"master_port", "--master-port", "IDIST_MASTER_PORT", Type::integer},
    {"rdzv_id", "--rdzv-id", "IDIST_RDZV_ID", Type::string, true},
    {"rdzv_endpoint", "--rdzv-endpoint", "IDIST_RDZV_ENDPOINT", Type::string},
    {"rdzv_conf", "--rdzv-conf", "IDIST_RDZV_CONF", Type::string},
    {"port_range", "--port-range", "IDIST_PORT_RANGE", Type::string},
    {"launcher", "--launcher", "IDIST_LAUNCHER_KIND", Type::string},
    {"force_spawn", "--force-spawn", "IDIST_FORCE_SPAWN", Type::boolean},
    {"dry_run", "--dry-run", "IDIST_DRY_RUN", Type::boolean},
    {"backend", "--backend", "IDIST_BACKEND", Type::string},
    {"tag_output", "--tag-output", "IDIST_TAG_OUTPUT", Type::boolean},
    {"grace", "--grace", "IDIST_GRACE", Type::number},
    {"stall_timeout", "--stall-timeout", "IDIST_STALL_TIMEOUT", Type::number},
    {"stall_action", "--stall-action", "IDIST_STALL_ACTION", Type::string},
    {"timeout", "--timeout", "IDIST_JOB_TIMEOUT", Type::number},
    {"max_restarts", "--max-restarts", "IDIST_MAX_RESTARTS", Type::integer},
    {"forward_signals", "--forward-signals", "IDIST_FORWARD_SIGNALS", Type::string},
    {"log_dir", "--log-dir", "IDIST_LOG_DIR", Type::string},
    {"verbose", "--verbose", "IDIST_VERBOSE", Type::boolean},
    {"module", "--module", "IDIST_MODULE", Type::boolean},
    {"no_python", "--no-python", "IDIST_NO_PYTHON", Type::boolean},
    {"bind", "--bind", "IDIST_BIND", Type::boolean},
    {"keep_slurm_env", "--keep-slurm-env", "IDIST_KEEP_SLURM_ENV", Type::boolean},
    {"local_rank_arg", "--local-rank-arg", "IDIST_LOCAL_RANK_ARG", Type::boolean},
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

// `setting`'s value from its variable; nullopt when it is unset or empty. A flag's variable
// takes 1/true/yes or 0/false/no; anything else is a UsageError naming the variable.
std::optional<Value> from_env(const Setting& setting, const env::Lookup& lookup = env::process_env());

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
