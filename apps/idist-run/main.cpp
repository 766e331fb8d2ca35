// idist-run: start a program as a distributed job.
//
// Parses the command line, asks launchers/ for a plan, and runs it. Everything that decides
// who a rank is lives in launchers/; this file only turns argv (and, through
// launchers/config, IDIST_* variables and a --config file) into options and errors into exit
// codes (2 for bad usage, as with most Unix tools).

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <type_traits>
#include <variant>

#include "idist/launchers/config.hpp"
#include "idist/launchers/exec.hpp"
#include "idist/launchers/plan.hpp"
#include "idist/launchers/etcd_rendezvous.hpp"
#include "idist/launchers/logging.hpp"
#include "idist/launchers/rendezvous.hpp"
#include "idist/launchers/program.hpp"
#include "idist/launchers/resources.hpp"
#include "idist/launchers/signals.hpp"
#include "idist/launchers/status.hpp"
#include "idist/launchers/supervisor.hpp"
#include "idist/plugins.hpp"

extern char** environ;

namespace {

namespace config = idist::launchers::config;
using idist::launchers::UsageError;

constexpr int kUsageExit = 2;

const char* const kExamples = R"(Examples:
  idist-run -n 4 ./train --epochs 10        4 local ranks; options after the program are its own
  idist-run -n 3 --tag-output ./all_reduce  prefix every output line with [rank N]
  idist-run -n 2 --backend gloo ./train     force the backend the program uses (IDIST_BACKEND)
  srun -n 8 idist-run ./train               one rank per SLURM task (also mpirun -np 8 idist-run ...)
  srun -N 2 --ntasks-per-node=1 idist-run -n 4 ./train
                                            one task per node, 4 ranks spawned on each
  idist-run --nnodes 2 --node-rank 0 --master-addr node0 --rdzv-id $ID -n 4 ./train
                                            node 0 of 2 without a scheduler (node 1: --node-rank 1;
                                            ID: the same secret on both, e.g. openssl rand -hex 8)
  idist-run --dry-run ./train               print the plan as JSON and start nothing
  idist-run -n 4 --max-restarts 3 --log-dir logs ./train
                                            restart every rank after a failure, up to 3 times;
                                            logs/<run-id>/attempt_<k>/rank_<r>.{out,err} and summary.json
  idist-run -n 4 --timeout 3600 --grace 30 ./train
                                            stop the job after an hour; SIGKILL 30 s after SIGTERM
  idist-run -n 2 -- ./app -n 5              '--' ends idist-run's options explicitly
  idist-run --config config/single-node.json ./train
                                            settings from a launch profile (see "Settings" below)
  IDIST_NPROC_PER_NODE=4 idist-run ./train  the same from the environment

Detection, first match wins: --nnodes/--node-rank > SLURM step (srun) > Open MPI > PMIx >
MPICH/Intel MPI > MVAPICH > horovodrun > RANK/WORLD_SIZE already set > local spawn.
Force one with --launcher; IDIST_NO_DETECT=1 turns detection off.
Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR,
MASTER_PORT and friends, as torch.distributed's env:// expects, and PYTHONUNBUFFERED=1 unless
it is set (a rank's stdout is a pipe, where Python would hold its output back until exit).
Supervision (when idist-run spawns the ranks): the first rank to fail stops the others
(SIGTERM, then SIGKILL after --grace; 250 ms later when it exited non-zero, so that a peer
already exiting keeps its own exit code); the summary names it, the ranks stopped as collateral
and its last stderr lines. SIGINT, SIGTERM, SIGHUP and SIGQUIT stop the job (a second one
kills at once); the --forward-signals go to every rank and the job goes on. Whatever a rank
leaves behind (forked helpers, daemons) is killed when its attempt ends. --max-restarts
restarts every local rank (IDIST_RESTART_COUNT=k, a fresh MASTER_PORT when idist-run picked
it); over several nodes (--nnodes) it is one budget for the job, every node restarting together.
With live recovery on one node it also lets idist-run start up to that many ranks in lost ones'
places, admitted mid-run where every rank admits them (idist::Recovery; docs/RECOVERY.md).
Ranks failing together: one killed or crashed by a signal idist-run did not send is named
before one that exited non-zero, aborted or died of SIGPIPE (what survivors of a dead peer do).
The console never holds up supervision: a slow reader holds the ranks back, one that stops
reading for 2 s or goes away (| head) has lines dropped, told in one line per stream at the
end; --log-dir files keep every byte. A log file that cannot take every byte (a full disk)
is named with the bytes it lacks.
summary.json: run_id, host, exit_code, outcome, log_bytes_lost, console_dropped {stdout,
stderr: {lines, bytes}}, and per attempt its master_port, times, first_failure and ranks
[{rank, pid, host, exit_code, signal, core_dumped, start, end, collateral, first_failure,
log_bytes_lost {out, err}}] (times in UTC, ISO 8601).
Exit status: 0 when every rank succeeds; else the first failing rank's code (128+signal
when killed by a signal); 128+signal when idist-run itself is interrupted; 124 on --timeout;
1 when every rank succeeded but --log-dir lost bytes or summary.json; 2 for bad usage.
Console output dropped leaves the exit status as it is.)";

// The settings (config::Options, one member per config::kSettings entry), the actions that
// are not settings, and the program.
struct Cli : config::Options {
  bool status = false;  // --status [PID]: ask a running job where its ranks are
  std::optional<std::string> config_file;
  bool print_config_keys = false;
  bool print_config = false;
  std::vector<std::string> command;

  // What came from the environment or the config file, by setting key ("program" included),
  // so that errors about those values name where they came from.
  std::map<std::string, config::Value, std::less<>> outside;
  std::vector<config::Resolved> resolved;  // every setting's value and origin, for --dry-run
};

// Runs `check` on the value of setting `key`. When that value came from the environment or
// the config file, the error (the same as for the command line) is prefixed with its origin:
// "IDIST_NPROC_PER_NODE='0': --nproc-per-node 0 is out of range (1 to 4096)".
template <class Check>
auto checked(const Cli& cli, std::string_view key, Check&& check) {
  try {
    return check();
  } catch (const UsageError& e) {
    const auto it = cli.outside.find(key);
    if (it == cli.outside.end()) throw;
    throw UsageError(fmt::format("{}: {}", it->second.context, e.what()));
  }
}

int parse_count(const std::string& option, const std::string& text, int max, const std::string& what) {
  int value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end)
    throw UsageError(option + " '" + text + "' is not " + what);
  if (ec == std::errc::result_out_of_range || value < 1 || value > max)
    throw UsageError(option + " " + text + " is out of range (1 to " + std::to_string(max) + ")");
  return value;
}

// --nnodes N or MIN:MAX: {MIN, MAX}.
std::pair<int, int> parse_nnodes(const std::string& text) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    const int n = parse_count("--nnodes", text, 65536, "a number of nodes or MIN:MAX");
    return {n, n};
  }
  const int min = parse_count("--nnodes", text.substr(0, colon), 65536, "a number of nodes or MIN:MAX");
  const int max = parse_count("--nnodes", text.substr(colon + 1), 65536, "a number of nodes or MIN:MAX");
  if (min > max) throw UsageError("--nnodes " + text + ": MIN is above MAX");
  return {min, max};
}

// --rdzv-backend: torchrun's names. c10d and static are the built-in rendezvous (node 0's
// idist-run); etcd and etcd-v2 (torchrun's two etcd rendezvous) are ours on etcd's v3 API.
bool etcd_backend(const std::string& b) { return config::torchrun_rdzv_backend("--rdzv-backend", b) == "etcd"; }

// --timeout: seconds above 0 (up to about 31 years).
double parse_timeout(const std::string& text) {
  try {
    return config::parse_seconds(text, {.min = 0, .min_exclusive = true, .max = 1e9});
  } catch (const UsageError& e) {
    throw UsageError(std::string("--timeout ") + e.what());
  }
}

// --grace, --stall-timeout: seconds from 0 (none, or off) to `max`; a positive value under a
// millisecond would be 0 to the timers (and turn the stall reports off without a word).
// --heartbeat-timeout: 0 (off), or at least `least`: the ranks beat 10 times a second.
CLI::Validator seconds_from_zero(double max, double least = 0.001) {
  return CLI::Validator(
      [max, least](std::string& text) -> std::string {
        try {
          const double value = config::parse_seconds(text, {.min = 0, .min_exclusive = false, .max = max});
          if (value > 0 && value < least && least == 0.001)
            return text + " is under a millisecond: give 0, or at least 0.001";
          if (value > 0 && value < least)
            return text + " is under " + std::to_string(static_cast<int>(least)) +
                   " s (the ranks beat 10 times a second): give 0, or at least " + std::to_string(static_cast<int>(least));
        } catch (const UsageError& e) {
          return e.what();
        }
        return "";
      },
      "SECONDS");
}

// --log-dir must be a directory we can write to, checked before any rank starts.
void check_log_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError("--log-dir '" + dir + "': " + ec.message());
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw UsageError("--log-dir '" + dir + "': not writable");
}

namespace L = idist::launchers;

// The plan's options from the command line (and what fill_in gave it), each value checked
// where its error can name where it came from.
L::LaunchOptions launch_options(const Cli& cli) {
  L::LaunchOptions options;
  if (cli.nproc_per_node == "auto") {
    // One rank per GPU where there are GPUs (the nccl way), else one per core we may use.
    const auto gpus = L::visible_gpus();
    const auto cores = static_cast<int>(L::usable_cpus().size());
    options.nproc_per_node = std::min(gpus.count > 0 ? gpus.count : cores, 4096);
    spdlog::info("-n auto: {} rank(s): {}{}", *options.nproc_per_node, gpus.why,
                 gpus.count > 0 ? "" : fmt::format(", so one per usable core ({})", cores));
  } else if (cli.nproc_per_node) {
    options.nproc_per_node = checked(cli, "nproc_per_node", [&] {
      return parse_count("--nproc-per-node", *cli.nproc_per_node, 4096, "a number of processes or 'auto'");
    });
  }
  if (cli.nnodes) {
    const auto [min, max] = checked(cli, "nnodes", [&] { return parse_nnodes(*cli.nnodes); });
    options.nnodes = max;
    if (min < max) options.min_nodes = min;
  }
  options.rdzv_endpoint = cli.rdzv_endpoint;
  bool ignore_node_rank = false;
  if (checked(cli, "rdzv_backend", [&] { return etcd_backend(cli.rdzv_backend); })) {
    try {
      L::require_etcd_built();
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
    if (!cli.rdzv_endpoint) throw UsageError("--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...]: etcd's members");
    // A PyTorchJob's Master replica (operator v1.7+) has PET_NODE_RANK, which torchrun's etcd
    // rendezvous ignores: so does ours.
    const auto from = cli.outside.find("node_rank");
    ignore_node_rank = cli.node_rank && from != cli.outside.end() && from->second.from == "PET_NODE_RANK";
    if (cli.node_rank && !ignore_node_rank)
      throw UsageError("--node-rank does not go with --rdzv-backend etcd: etcd ranks the nodes");
    // The plan's rendezvous endpoint stands for etcd's first member; MASTER_ADDR comes from
    // each attempt's assignment.
    checked(cli, "rdzv_endpoint", [&] {
      try {
        options.rdzv_endpoint = L::etcd_first_endpoint(*cli.rdzv_endpoint);
      } catch (const std::invalid_argument& e) {
        throw UsageError("--rdzv-endpoint " + std::string(e.what()));
      }
    });
  }
  if (!ignore_node_rank) options.node_rank = cli.node_rank;
  options.master_addr = cli.master_addr;
  options.master_port = cli.master_port;
  options.rdzv_id = cli.rdzv_id;
  options.port_range = checked(cli, "port_range", [&] {
    try {
      return L::parse_port_range("--port-range", cli.port_range);
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());
    }
  });
  options.backend = cli.backend;
  options.launcher = cli.launcher;
  options.no_detect = config::no_detect_from_env();
  options.force_spawn = cli.force_spawn;
  options.dry_run = cli.dry_run;
  // Neither --bind nor --no-bind (nor IDIST_BIND, nor a config file's bind): make_plan decides.
  const auto bind = std::find_if(cli.resolved.begin(), cli.resolved.end(),
                                 [](const config::Resolved& r) { return r.setting->key == "bind"; });
  if (bind != cli.resolved.end() && bind->text) options.bind = cli.bind ? L::Bind::always : L::Bind::never;
  options.keep_slurm_env = cli.keep_slurm_env;
  options.local_rank_arg = cli.local_rank_arg;
  options.max_restarts = cli.max_restarts;
  options.command = cli.command;
  options.program_path = checked(cli, "program", [&] { return L::resolve_program(cli.command.front()); });
  return options;
}

std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

// How the ranks are watched; checked, as the plan's options, before anything starts.
L::SuperviseOptions supervise_options(const Cli& cli) {
  L::SuperviseOptions supervise;
  supervise.forward_signals = checked(cli, "forward_signals", [&] {
    try {
      return L::parse_signal_list(cli.forward_signals);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--forward-signals: ") + e.what());
    }
  });
  if (cli.timeout_seconds) {
    const double seconds = checked(cli, "timeout", [&] { return parse_timeout(*cli.timeout_seconds); });
    supervise.timeout = std::max(std::chrono::milliseconds(1), milliseconds(seconds));
  }
  if (!cli.log_dir.empty()) checked(cli, "log_dir", [&] { check_log_dir(cli.log_dir); });
  supervise.tag_output = cli.tag_output;
  supervise.grace = milliseconds(cli.grace_seconds);
  supervise.stall_timeout = milliseconds(cli.stall_seconds);
  supervise.heartbeat_timeout = milliseconds(cli.heartbeat_seconds);
  supervise.stall_action = cli.stall_action == "kill" ? L::SuperviseOptions::StallAction::kill
                                                      : L::SuperviseOptions::StallAction::report;
  supervise.recovery = cli.recovery == "auto";
  supervise.min_world = cli.min_world;
  supervise.status_socket = true;
  supervise.stacks = true;
  supervise.max_restarts = cli.max_restarts;
  supervise.log_dir = cli.log_dir;
  supervise.metrics = cli.metrics;
  supervise.straggler_threshold = cli.straggler_percent / 100;
  supervise.trace = cli.trace;
  return supervise;
}

void announce(const L::LaunchPlan& plan) {
  if (const auto& r = plan.rendezvous)
    spdlog::info("{} ranks here, one node of {}, meeting at {}:{}; run id {}", plan.local_count,
                 r->min_nodes == r->max_nodes ? std::to_string(r->max_nodes)
                                              : std::to_string(r->min_nodes) + " to " + std::to_string(r->max_nodes),
                 r->host, r->port, plan.job.run_id);
  else
    spdlog::info("{} ({}): world size {}, {} here, MASTER_ADDR={} MASTER_PORT={} run id {}", plan.job.launcher,
                 plan.mode == L::Mode::exec ? "exec in place" : "spawn", plan.job.world_size, plan.local_count,
                 plan.job.master_addr, plan.job.master_port, plan.job.run_id);
}

// One task per rank: the program replaces us, so there is no output to tag and no rank of ours
// to stop. Returns only when execve failed.
int exec_here(const Cli& cli, const L::LaunchPlan& plan, const std::string& path) {
  if (cli.tag_output)
    spdlog::warn("--tag-output does nothing when idist-run execs in place (one task per rank); "
                 "the outer launcher's own option does it (srun --label, mpirun --tag-output)");
  if (cli.bind)
    spdlog::warn("--bind does nothing when idist-run execs in place (one task per rank): the outer launcher "
                 "binds its tasks (srun --cpu-bind, mpirun --bind-to)");
  if (cli.timeout_seconds || cli.max_restarts > 0 || !cli.log_dir.empty())
    spdlog::warn("--timeout, --max-restarts and --log-dir do nothing when idist-run execs in place (one task per "
                 "rank): there is no rank of ours to watch; the outer launcher's options do it");
  try {
    L::exec_in_place(plan, path, environ);
  } catch (const L::ExecError& e) {
    spdlog::error("{}", e.what());
    return e.code();
  }
  return 1;  // exec_in_place returns only by throwing
}

// A round of the rendezvous that does not fill waits as long as the ranks' own rendezvous
// would: IDIST_TIMEOUT.
auto join_timeout_from_env() {
  auto join_timeout = idist::env::kDefaultTimeout;
  if (const char* t = std::getenv(std::string(idist::env::kTimeout).c_str()); t != nullptr && *t != '\0') {
    try {
      join_timeout = idist::env::parse_timeout(idist::env::kTimeout, t);
    } catch (const std::exception& e) {
      throw UsageError(e.what());
    }
  }
  return join_timeout;
}

// A job over several nodes: this node's part of its rendezvous (--rdzv-backend c10d or etcd).
std::shared_ptr<L::Coordinator> rendezvous(const Cli& cli, const L::LaunchPlan& plan) {
  auto ro = L::rendezvous_options(plan, cli.max_restarts, join_timeout_from_env(), milliseconds(cli.grace_seconds));
  ro.stall_timeout = milliseconds(cli.stall_seconds);
  ro.recovery = cli.recovery == "auto";
  ro.min_world = cli.min_world;
  if (!etcd_backend(cli.rdzv_backend)) {
    checked(cli, "rdzv_conf", [&] { config::parse_rdzv_conf(cli.rdzv_conf, ro); });
    return L::make_coordinator(ro, nullptr);
  }
  L::EtcdRendezvousOptions eo;
  checked(cli, "rdzv_conf", [&] { config::parse_rdzv_conf(cli.rdzv_conf, ro, &eo); });
  eo.endpoints = *cli.rdzv_endpoint;
  if (cli.rdzv_id) eo.job_id = *cli.rdzv_id;
  return L::make_coordinator(ro, &eo);
}

L::UcxHere ucx_here();

// Options -> plan -> exec in place (one task per rank) | spawn and supervise the ranks.
int run(const Cli& cli) {
  const auto options = launch_options(cli);
  auto supervise = supervise_options(cli);
  auto plan = L::make_plan(options);
  for (const auto& note : plan.notes) spdlog::info("{}", note);
  if (cli.dry_run) {
    const auto program_from = cli.outside.contains("program") ? cli.outside.at("program").from : "command line";
    std::cout << config::add_settings(L::dry_run_json(plan, ucx_here()), cli.resolved, program_from) << std::endl;
    return 0;
  }
  announce(plan);
  const std::string& path = options.program_path;
  if (plan.mode == L::Mode::exec) return exec_here(cli, plan, path);

  // Held until we return: the ranks' cpus are ours while the job runs (released on any exit).
  const auto binding = L::hold_binding(plan, options.bind);
  spdlog::info("{}", plan.binding);
  for (std::size_t local = 0; local < plan.cpu_shares.size(); ++local)
    spdlog::info("local rank {} on cpu(s) {}", local, L::cpu_list(plan.cpu_shares[local]));
  std::shared_ptr<L::Coordinator> coordinator;
  if (plan.rendezvous) {
    try {
      coordinator = rendezvous(cli, plan);
    } catch (const UsageError&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw UsageError(e.what());  // names the option: --rdzv-endpoint, or --rdzv-conf's TLS files
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());  // node 0 cannot listen at the endpoint
      return 1;
    }
    supervise.coordinator = coordinator;
  }
  const L::MakeAttempt make_attempt = [&](int restart_count) {
    L::follow_binding(plan, *binding);  // restarts included
    if (const auto note = binding->take_note(); !note.empty()) spdlog::info("{}", note);
    binding->watch();
    if (coordinator) {
      const auto& a = coordinator->assignment();
      L::apply_assignment(plan, a);
      spdlog::info("attempt {}: node {} of {}, ranks {} to {} of {}, MASTER_ADDR={} MASTER_PORT={}", a.attempt,
                   a.node_rank, a.nnodes, a.rank_base, a.rank_base + plan.local_count - 1, a.world_size,
                   plan.job.master_addr, a.master_port);
    }
    return L::attempt_of(plan, path, restart_count, environ);
  };
  supervise.run_id = plan.job.run_id;
  const int code = L::supervise(make_attempt, supervise);
  // The watcher's word, if it let go while the ranks ran (it may not write to the console).
  if (const auto note = binding->take_note(); !note.empty()) spdlog::info("{}", note);
  return code;
}

// The config file --config or IDIST_CONFIG names, if any.
std::optional<config::File> load_config(const Cli& cli) {
  if (cli.config_file) return config::read_file(*cli.config_file, fmt::format("--config '{}'", *cli.config_file));
  const char* path = std::getenv(std::string(config::kConfigEnv).c_str());
  if (path == nullptr || *path == '\0') return std::nullopt;
  return config::read_file(path, fmt::format("{}='{}'", config::kConfigEnv, path));
}

// Gives every option the command line left unset its value from the environment, else from
// the config file. The value goes through the option itself, so CLI11 converts and checks it
// as it does on the command line; its errors then name where the value came from.
void fill_in(CLI::App& app, Cli& cli, const std::optional<config::File>& file) {
  for (const auto& setting : config::kSettings) {
    CLI::Option* option = app.get_option(std::string(setting.option));
    const bool on_command_line = option->count() > 0;
    if (!on_command_line) {
      auto value = config::from_env(setting);
      if (!value && file) {
        const auto it = file->values.find(setting.key);
        if (it != file->values.end()) value = it->second;
      }
      if (value) {
        // A file's "" (a variable's is refused by from_env): after the file and key, as its other errors.
        if (value->text.empty() && setting.type != config::Type::boolean)
          throw UsageError(fmt::format("{}: {}", value->context, config::empty_value(setting.option, config::wanted(setting))));
        try {
          option->clear();
          option->add_result(value->text);
          option->run_callback();
        } catch (const CLI::ParseError& e) {
          throw UsageError(fmt::format("{}: {}", value->context, e.what()));
        }
        cli.outside.emplace(std::string(setting.key), std::move(*value));
      }
    }
    config::Resolved resolved{&setting, std::nullopt, "default"};
    if (option->count() > 0) {
      resolved.text = setting.type == config::Type::boolean ? (option->as<bool>() ? "true" : "false")
                                                             : option->as<std::string>();
      resolved.from = on_command_line ? std::string(setting.option) : cli.outside.at(std::string(setting.key)).from;
      // --no-bind is --bind's negation: name the one given.
      if (on_command_line && setting.unset_decides && resolved.text == "false") resolved.from = "--no-" + std::string(setting.option.substr(2));
    } else if (setting.type == config::Type::boolean && !setting.unset_decides) {
      resolved.text = "false";
    } else if (!option->get_default_str().empty()) {
      resolved.text = option->get_default_str();
    }
    cli.resolved.push_back(std::move(resolved));
  }
}

// torchrun runs its script under the Python that runs torchrun; idist-run runs any program,
// so only a module (-m) or a program named *.py goes under the python3 in PATH, unless
// --no-python. -u, as torchrun passes it: a rank's stdout is a pipe, and Python would hold
// back its output until exit.
void under_python(Cli& cli) {
  if (cli.module && cli.no_python)
    throw UsageError("--module and --no-python together: a module (-m) can only run under python3");
  const bool script = !cli.no_python && cli.command.front().ends_with(".py");
  if (!cli.module && !script) return;
  std::vector<std::string> command = {"python3", "-u"};
  if (cli.module) command.emplace_back("-m");
  command.insert(command.end(), cli.command.begin(), cli.command.end());
  cli.command = std::move(command);
}

// --version: the backends a rank can use, as they are installed now rather than as built:
// gloo is in libidist, the others are plugins, found and checked by libidist's own loader
// (idist::plugin_status), in the words init() would use to refuse them.
std::string version_text() {
  std::string usable = "gloo";
  std::string lines = "\n  gloo: built into libidist";
  for (const std::string_view name : idist::env::kBackendNames) {
    if (name == "gloo") continue;
    const auto plugin = idist::plugin_status(name);
    if (plugin.usable()) usable += fmt::format(", {}", name);
    lines += fmt::format("\n  {}: {}", name, plugin.usable() ? plugin.path : plugin.error);
  }
  return fmt::format("idist-run {} (backends: {}){}", IDIST_VERSION, usable, lines);
}

// For --dry-run: whether this host's ranks could load the ucx plugin.
L::UcxHere ucx_here() {
  const auto plugin = idist::plugin_status("ucx");
  return {plugin.usable(), plugin.usable() ? plugin.path : plugin.error};
}

// CLI11's usage line ("idist-run [OPTIONS]") knows nothing of the program that follows; ours
// replaces it, so that --help (and the man page help2man makes of it) has one.
class HelpFormat : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: idist-run [OPTIONS] [--] PROGRAM [ARGS...]\n";
  }
};

// mpirun's -np, which CLI11 would read as -n with the value "p" ("--nproc-per-node 'p' is not
// a number"). Only among idist-run's own options: the program's -np is the program's.
void refuse_mpirun_np(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--" || word == "-" || !word.starts_with("-")) return;
    if (word.starts_with("-np") && word.find_first_not_of("0123456789", 3) == std::string::npos) {
      std::string count = word.size() > 3 ? word.substr(3) : i + 1 < argc ? argv[i + 1] : "";
      if (count.empty() || count.find_first_not_of("0123456789") != std::string::npos) count = "N";
      throw UsageError(fmt::format("unknown option -np: did you mean -n {} (--nproc-per-node)?", count));
    }
    // An option's value is the next word, unless it is joined to it (--grace=3, -n4).
    const CLI::Option* option = word.find('=') == std::string::npos ? app.get_option_no_throw(word) : nullptr;
    if (option != nullptr && option->get_type_size_max() > 0) ++i;
  }
}

// The check config::Check names, as CLI11 runs it on the command line's value and on those
// fill_in passes through the option from a variable or a config file.
void add_check(CLI::Option* option, const config::Setting& setting) {
  const auto one_of = [](const auto& names) {
    return CLI::IsMember(std::vector<std::string>(std::begin(names), std::end(names)));
  };
  switch (setting.check) {
    case config::Check::none: return;
    case config::Check::port: option->check(CLI::Range(1, 65535)); return;
    case config::Check::node_rank: option->check(CLI::Range(0, 65535)); return;
    case config::Check::launcher: option->check(one_of(idist::launchers::kLauncherChoices)); return;
    case config::Check::backend: option->check(one_of(idist::env::kBackendNames)); return;
    case config::Check::grace: option->check(seconds_from_zero(3600)); return;
    case config::Check::stall_timeout: option->check(seconds_from_zero(1e6)); return;
    case config::Check::heartbeat_timeout: option->check(seconds_from_zero(3600, 1)); return;
    case config::Check::stall_action: option->check(CLI::IsMember({"report", "kill"})); return;
    case config::Check::recovery: option->check(CLI::IsMember({"auto", "off"})); return;
    case config::Check::min_world: option->check(CLI::Range(1, 1 << 20)); return;
    case config::Check::restarts: option->check(CLI::Range(0, 10000)); return;
    case config::Check::percent: option->check(CLI::Range(0.0, 1000.0)); return;
  }
}

// Every setting's option, as config::kSettings declares it: spellings, help, where its value
// goes (a bool member is a flag), its check, and its default shown where the table says so.
void add_setting_options(CLI::App& app, Cli& cli) {
  for (const auto& setting : config::kSettings) {
    std::string names(setting.option);
    if (!setting.also.empty()) names += "," + std::string(setting.also);
    const std::string help(setting.help);
    CLI::Option* option = std::visit(
        [&](auto member) -> CLI::Option* {
          auto& value = cli.*member;
          if constexpr (std::is_same_v<std::remove_reference_t<decltype(value)>, bool>)
            return app.add_flag(names, value, help);
          else
            return app.add_option(names, value, help);
        },
        setting.target);
    // First, so that an empty value meets the one rule (config::empty_value), not the next check.
    // It throws, rather than failing the check: CLI11 would put the option's name before the
    // sentence that already names it.
    if (setting.type != config::Type::boolean)
      option->check(CLI::Validator(
          [&setting](const std::string& v) -> std::string {
            config::refuse_empty(setting.option, v, config::wanted(setting));
            return "";
          },
          ""));
    add_check(option, setting);
    if (setting.show_default) option->capture_default_str();
  }
}

// Every option has its variable and config key (config::kSettings), so neither can fall behind.
void check_settings_cover(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_lnames().empty()) continue;
    const std::string name = "--" + option->get_lnames().front();
    const bool known = std::any_of(std::begin(config::kSettings), std::end(config::kSettings),
                                   [&](const config::Setting& s) { return s.option == name; });
    if (!known && name != "--help" && name != "--version" && name != config::kConfigOption &&
        name != "--print-config-keys" && name != "--print-config" && name != "--status")
      throw std::logic_error(name + " has no entry in config::kSettings (its variable and config key)");
  }
}

}  // namespace

// --status [PID]: the remaining word, if any, is the pid of the idist-run to ask.
int ask_status(const CLI::App& app) {
  const auto& words = app.remaining();
  if (words.size() > 1 || (words.size() == 1 && words.front().find_first_not_of("0123456789") != std::string::npos))
    throw UsageError("--status takes at most one argument, the pid of the idist-run to ask (got '" +
                     words.front() + "')");
  std::optional<pid_t> pid;
  if (words.size() == 1) pid = static_cast<pid_t>(std::stol(words.front()));
  return idist::launchers::print_status(pid);
}

// After the command line: the environment and a config file fill in what it left unset, the
// program is found (the command line's, else the file's), and the job runs.
int settle_and_run(CLI::App& app, Cli& cli) {
  const auto file = load_config(cli);
  fill_in(app, cli, file);
  const auto& rest = app.remaining();
  const bool after_dashes = !rest.empty() && rest.front() == "--";
  cli.command.assign(rest.begin() + (after_dashes ? 1 : 0), rest.end());
  if (!cli.command.empty() && cli.command.front().starts_with("-") && !after_dashes)
    throw UsageError("unknown option '" + cli.command.front() + "' (see idist-run --help)");
  if (cli.print_config) {
    std::vector<std::string> program = cli.command;
    std::string from = "command line";
    if (program.empty() && file) {
      program = file->program;
      from = file->from(config::kProgramKey);
    }
    std::cout << config::effective_table(cli.resolved, program, from) << std::endl;
    return 0;
  }
  if (cli.command.empty() && file && !file->program.empty()) {
    cli.command = file->program;
    cli.outside.emplace(std::string(config::kProgramKey),
                        config::Value{cli.command.front(), file->from(config::kProgramKey),
                                      file->context(config::kProgramKey)});
  } else if (cli.command.empty()) {
    throw UsageError("no program given (idist-run [OPTIONS] PROGRAM [ARGS...])");
  }
  under_python(cli);
  idist::launchers::setup_logging("idist-run", cli.verbose);
  // -v for the ranks too: the library's choices (the transport between hosts) in one line.
  if (cli.verbose) ::setenv(std::string(idist::env::kVerbose).c_str(), "1", /*overwrite=*/0);
  return run(cli);
}

int main(int argc, char** argv) {
  CLI::App app{"idist-run: run a program as a distributed job (local ranks over gloo, nccl or mpi)", "idist-run"};
  app.formatter(std::make_shared<HelpFormat>());
  app.footer(std::string(kExamples) + "\n\n" + config::help_table());
  app.set_version_flag("--version", version_text,
                       "Print the version and the backends installed (each plugin loaded as a rank would), and exit");
  Cli cli;
  add_setting_options(app, cli);
  app.add_flag("--status", cli.status,
               "Print where every rank of the running job is (idist-run --status [PID]: which job, when several "
               "run here), and exit");
  app.add_option(std::string(config::kConfigOption), cli.config_file,
                 "Take the settings this command line leaves unset from a JSON launch profile (see Settings below)");
  app.add_flag("--print-config-keys", cli.print_config_keys, "Print the keys a --config file may hold, and exit");
  app.add_flag("--print-config", cli.print_config,
               "Print every setting's effective value and where it came from (command line, variable, file, "
               "default), and exit");
  // The first word that is not one of our options starts the program's command line.
  app.prefix_command();

  try {
    check_settings_cover(app);
    refuse_mpirun_np(app, argc, argv);
    app.parse(argc, argv);
    if (cli.print_config_keys) {
      for (const auto& key : config::accepted_keys()) std::cout << key << "\n";
      return 0;
    }
    if (cli.status) return ask_status(app);
    return settle_and_run(app, cli);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "idist-run: error: " << e.what() << "\n";
    return kUsageExit;
  } catch (const UsageError& e) {
    std::cerr << "idist-run: error: " << e.what() << "\n";
    return kUsageExit;
  } catch (const idist::launchers::DetectError& e) {
    std::cerr << "idist-run: error: " << e.what() << "\n";
    return kUsageExit;
  } catch (const std::exception& e) {
    std::cerr << "idist-run: error: " << e.what() << "\n";
    return 1;
  }
}
