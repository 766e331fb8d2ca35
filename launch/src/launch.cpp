// idist::spawn and idist::Parallel: launchers/ decides who the ranks are (make_plan) and
// supervises them; lib/ initialises each. This file only joins the two: nothing here detects a
// launcher or watches a process itself.

#include "idist/launch.hpp"

#include <dirent.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <string_view>

#include "idist/env_contract.hpp"
#include "idist/launchers/config.hpp"
#include "idist/launchers/detect.hpp"
#include "idist/launchers/logging.hpp"
#include "idist/launchers/plan.hpp"
#include "idist/launchers/program.hpp"
#include "idist/launchers/rendezvous.hpp"
#include "idist/launchers/supervisor.hpp"

extern char** environ;

namespace idist {
namespace {

namespace L = idist::launchers;

[[noreturn]] void fail(const std::string& op, const SpawnOptions& o, const std::string& why) {
  throw Error({-1, 0, op, o.backend}, why);
}

// The numeric entries of a /proc directory (/proc/self/task, /proc/self/fd).
std::vector<int> entries_of(const char* path) {
  std::vector<int> out;
  if (DIR* dir = ::opendir(path)) {
    while (const dirent* entry = ::readdir(dir))
      if (entry->d_name[0] != '.' && std::atoi(entry->d_name) != ::dirfd(dir)) out.push_back(std::atoi(entry->d_name));
    ::closedir(dir);
  }
  return out;
}

// The options as launchers/ takes them, checked under the names the caller used.
L::LaunchOptions launch_options(const std::string& op, const SpawnOptions& o) {
  const auto check = [&](bool ok, const std::string& why) {
    if (!ok) fail(op, o, why);
  };
  if (o.nproc_per_node)
    check(*o.nproc_per_node >= 1 && *o.nproc_per_node <= 4096,
          "nproc_per_node=" + std::to_string(*o.nproc_per_node) + " is out of range (1 to 4096)");
  if (o.nnodes)
    check(*o.nnodes >= 1 && *o.nnodes <= 65536, "nnodes=" + std::to_string(*o.nnodes) + " is out of range (1 to 65536)");
  const int nnodes = o.nnodes.value_or(1);
  if (o.node_rank)
    check(*o.node_rank >= 0 && *o.node_rank < nnodes,
          "node_rank=" + std::to_string(*o.node_rank) + " is out of range (0 to nnodes - 1 = " +
              std::to_string(nnodes - 1) + ")");
  check(nnodes == 1 || o.node_rank.has_value(), "nnodes=" + std::to_string(nnodes) + " needs node_rank (this host's index)");
  check(nnodes == 1 || !o.master_addr.empty(),
        "nnodes=" + std::to_string(nnodes) + " needs master_addr: the host of node 0, where rank 0 runs");
  const auto token = std::getenv(std::string(env::kJobToken).c_str());
  check(nnodes == 1 || !o.rdzv_id.empty() || (token != nullptr && *token != '\0'),
        "nnodes=" + std::to_string(nnodes) +
            " needs rdzv_id (the same random id on every host, unique to the job) or IDIST_JOB_TOKEN exported, so "
            "that no other process can join the job");
  if (o.master_port)
    check(*o.master_port >= 1 && *o.master_port <= 65535,
          "master_port=" + std::to_string(*o.master_port) + " is out of range (1 to 65535)");
  if (o.timeout) check(o.timeout->count() > 0, "timeout must be above 0");

  L::LaunchOptions l;
  l.nproc_per_node = o.nproc_per_node;
  l.nnodes = o.nnodes;
  l.node_rank = o.node_rank;
  if (!o.master_addr.empty()) l.master_addr = o.master_addr;
  l.master_port = o.master_port;
  if (!o.rdzv_id.empty()) l.rdzv_id = o.rdzv_id;
  l.backend = o.backend;
  try {
    l.no_detect = L::config::no_detect_from_env();
  } catch (const L::UsageError& e) {
    fail(op, o, e.what());
  }
  return l;
}

// Where this process stands.
struct Situation {
  // A launcher started this process as a rank; the plan (mode exec) makes its contract.
  // Unset when idist-run did: the environment holds the contract already.
  std::optional<L::LaunchPlan> adopt;
  bool in_job = false;   // a launcher started this process as one of its ranks
  std::string launcher;  // for messages: "SLURM step", "Open MPI", "its launcher (IDIST_LAUNCHER=spawn)"
  int local_world_size = 1;
  int nnodes = 1;
  std::optional<L::LaunchPlan> spawn;  // the ranks to start here
};

std::string plan_error(const std::string& what) {
  // launchers/ speaks idist-run's options; the caller knows them as SpawnOptions fields.
  std::string out = what;
  for (const auto& [option, field] : std::map<std::string, std::string>{{"--master-port", "master_port"},
                                                                        {"--rdzv-id", "rdzv_id"},
                                                                        {"--master-addr", "master_addr"},
                                                                        {"--nproc-per-node", "nproc_per_node"},
                                                                        {"--nnodes", "nnodes"},
                                                                        {"--node-rank", "node_rank"},
                                                                        {"--backend", "backend"}})
    for (auto at = out.find(option); at != std::string::npos; at = out.find(option, at + field.size()))
      out.replace(at, option.size(), field);
  return out;
}

// `want_ranks`: make the plan of the ranks to start when no launcher started this process.
Situation look_around(const std::string& op, const SpawnOptions& o, bool want_ranks) {
  auto options = launch_options(op, o);
  Situation s;
  // The ranks to start here. mpi's are mpirun's to start: said here in the caller's words (the
  // plan's refusal names idist-run's options).
  auto spawn_plan = [&] {
    const int world = o.nproc_per_node.value_or(1) * o.nnodes.value_or(1);
    if (o.backend == "mpi" && world > 1)  // a world of one is MPI's singleton
      fail(op, o,
           fmt::format("backend mpi needs its ranks started by mpirun, not by {}: run the program under `mpirun -np "
                       "{}` (each process then joins as one rank), or use backend gloo",
                       op, world));
    return L::make_plan(options);
  };
  try {
    // idist-run's ranks (and a process a Parallel here set up) carry the whole contract.
    const auto contract = env::read_contract();
    if (contract.from_env && !contract.launcher.empty()) {
      s.in_job = true;
      s.launcher = contract.launcher == "spawn" ? "idist-run" : "its launcher (IDIST_LAUNCHER=" + contract.launcher + ")";
      s.local_world_size = contract.local_world_size;
      s.nnodes = contract.nnodes;
      return s;
    }
    // Any other launcher, seen as idist-run exec'd in its task would see it. A look first
    // (dry run: no port reserved), without the options that would make a job of our own.
    auto alone = options;
    alone.nproc_per_node.reset();
    alone.nnodes.reset();
    alone.node_rank.reset();
    alone.dry_run = true;
    if (L::make_plan(alone).mode == L::Mode::exec) {
      alone.dry_run = false;
      auto plan = L::make_plan(alone);
      s.in_job = true;
      s.launcher = plan.detected_by;
      s.local_world_size = plan.job.local_world_size;
      s.nnodes = plan.job.nnodes;
      // A task alone on its node, asked for several ranks: they are started per task.
      if (want_ranks && o.nproc_per_node.value_or(1) > 1 && !o.nnodes && plan.job.local_world_size == 1)
        s.spawn = spawn_plan();
      else
        s.adopt = std::move(plan);
      return s;
    }
    if (want_ranks) s.spawn = spawn_plan();
    return s;
  } catch (const Error&) {
    throw;  // said already
  } catch (const env::ContractError& e) {
    fail(op, o, e.what());
  } catch (const L::UsageError& e) {
    fail(op, o, plan_error(e.what()));
  } catch (const L::DetectError& e) {
    fail(op, o, e.what());
  } catch (const std::runtime_error& e) {  // a port that cannot be reserved
    fail(op, o, e.what());
  }
}

// This process becomes the rank the plan describes, as idist-run's exec would make it.
void adopt(const L::LaunchPlan& plan) {
  std::map<std::string, std::string> wanted;
  for (const auto& entry : L::rank_environment(plan, 0, environ)) {
    const auto eq = entry.find('=');
    wanted[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  std::vector<std::string> gone;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string name(entry.substr(0, entry.find('=')));
    if (!wanted.contains(name)) gone.push_back(name);
  }
  for (const auto& name : gone) ::unsetenv(name.c_str());
  for (const auto& [name, value] : wanted) ::setenv(name.c_str(), value.c_str(), 1);
}

void check_local_ranks(const std::string& op, const SpawnOptions& o, const Situation& s) {
  if (o.nproc_per_node && *o.nproc_per_node != s.local_world_size)
    fail(op, o,
         "nproc_per_node=" + std::to_string(*o.nproc_per_node) + ", but " + s.launcher + " started this process as one of " +
             std::to_string(s.local_world_size) + " ranks on this node: start " + std::to_string(*o.nproc_per_node) +
             " (e.g. idist-run -n " + std::to_string(*o.nproc_per_node) + "), or run the program without a launcher");
  if (o.nnodes && *o.nnodes != s.nnodes)
    fail(op, o,
         "nnodes=" + std::to_string(*o.nnodes) + ", but " + s.launcher + " started this process in a job on " +
             std::to_string(s.nnodes) + " node(s)");
}

// The caller's spdlog default logger, put back after supervision (which logs through its own).
class LoggerKept {
 public:
  LoggerKept() : saved_(spdlog::default_logger()) {}
  ~LoggerKept() { spdlog::set_default_logger(saved_); }
  LoggerKept(const LoggerKept&) = delete;
  LoggerKept& operator=(const LoggerKept&) = delete;

 private:
  std::shared_ptr<spdlog::logger> saved_;
};

std::string last_lines_text(const std::vector<std::string>& lines) {
  if (lines.empty()) return "";
  std::string out = lines.size() == 1 ? "; its last stderr line: " : "; its last stderr lines: ";
  for (std::size_t i = 0; i < lines.size(); ++i) out += (i ? " | " : "") + lines[i];
  return out;
}

void start_ranks(const std::function<void(int)>& fn, const SpawnOptions& o, L::LaunchPlan plan) {
  const std::string op = "spawn";
  if (const auto threads = entries_of("/proc/self/task").size(); threads > 1)
    fail(op, o,
         "this process runs " + std::to_string(threads) +
             " threads; ranks are forked, and a fork copies locks that other threads hold and never release: call "
             "idist::spawn before starting threads (or start the ranks with idist-run)");
  // Supervision reaps every child and ends what is left below us: the caller's own would go too.
  if (const auto children = L::processes_below_us(); !children.empty()) {
    std::string pids;
    for (const int pid : children) pids += (pids.empty() ? "" : ", ") + std::to_string(pid);
    fail(op, o,
         "this process has child processes of its own (pid " + pids +
             "), which supervising the ranks would reap and stop: wait for them before idist::spawn, or start the "
             "ranks with idist-run");
  }
  if (o.timeout) plan.job.timeout = *o.timeout;
  const std::string backend = o.backend;
  const bool recovery = o.recovery;
  const auto callers_fds = entries_of("/proc/self/fd");
  const auto callers_logger = spdlog::default_logger();  // the ranks log as the caller does, not as supervision
  std::string self = "/proc/self/exe";
  char path[4096];
  if (const auto n = ::readlink("/proc/self/exe", path, sizeof(path)); n > 0) self.assign(path, static_cast<std::size_t>(n));
  L::SuperviseOptions supervise;
  std::shared_ptr<L::NodeAgent> agent;
  if (plan.rendezvous) {
    try {
      agent = std::make_shared<L::NodeAgent>(L::rendezvous_options(plan, 0, plan.job.timeout));
    } catch (const std::exception& e) {
      fail(op, o, e.what());
    }
    supervise.coordinator = agent;
  }
  const L::MakeAttempt make_attempt = [&](int restart_count) {
    if (agent) L::apply_assignment(plan, agent->assignment());
    auto attempt = L::attempt_of(plan, self, restart_count, environ);
    for (auto& process : attempt.processes) {
      process.inherited_fds = callers_fds;
      process.entry = [&fn, backend, recovery, callers_logger] {
        spdlog::set_default_logger(callers_logger);
        init({.backend = backend, .recovery = recovery});
        fn(get_local_rank());
        finalize();
        return 0;
      };
    }
    return attempt;
  };
  supervise.run_id = plan.job.run_id;
  supervise.report_failure = false;  // the exception says it
  // What the caller has buffered must not be written again by every rank.
  std::cout.flush();
  std::cerr.flush();
  std::clog.flush();
  std::fflush(nullptr);
  L::JobResult result;
  {
    const LoggerKept kept;
    L::setup_logging("idist::spawn", false);
    result = L::supervise_job(make_attempt, supervise);
  }
  if (result.exit_code == 0) return;
  if (const auto& f = result.first_failure) {
    std::string stopped;
    for (std::size_t i = 0; i < f->stopped.size(); ++i) stopped += (i ? ", " : "") + std::to_string(f->stopped[i]);
    throw SpawnError({f->rank, plan.job.world_size, op, backend},
                     "rank " + std::to_string(f->rank) + " (pid " + std::to_string(f->pid) + ") " + f->how +
                         (stopped.empty() ? "" : "; stopped rank(s) " + stopped) + last_lines_text(f->last_stderr),
                     f->exit_code, f->signal, f->last_stderr);
  }
  throw SpawnError({-1, plan.job.world_size, op, backend}, result.outcome, std::nullopt, std::nullopt, {});
}

void init_here(const SpawnOptions& o, Situation& s) {
  if (s.adopt) adopt(*s.adopt);
  if (o.timeout) {  // the launcher's contract has none of its own: ours, as spawned ranks get it
    env::Contract with_timeout;
    with_timeout.timeout = *o.timeout;
    for (const auto& [name, value] : env::to_variables(with_timeout))
      if (name == env::kTimeout) ::setenv(name.c_str(), value.c_str(), 1);
  }
  init({.backend = o.backend, .recovery = o.recovery});
}

}  // namespace

namespace detail {

void spawn(const std::function<void(int)>& fn, const SpawnOptions& o) {
  const std::string op = "spawn";
  if (is_initialized())
    fail(op, o, "idist is already initialised in this process: call spawn before init(), not from a rank");
  auto s = look_around(op, o, true);
  if (s.spawn) return start_ranks(fn, o, std::move(*s.spawn));
  check_local_ranks(op, o, s);
  init_here(o, s);
  // No finalize() when fn throws: it waits for every rank, which the others, blocked in a
  // collective with this one, never reach; the exception would surface only after the timeout.
  fn(get_local_rank());
  finalize();
}

}  // namespace detail

Parallel::Parallel(SpawnOptions options) : options_(std::move(options)) {
  const std::string op = "Parallel";
  auto s = look_around(op, options_, false);
  if (s.in_job) {
    const bool given = options_.nproc_per_node || options_.nnodes || options_.node_rank ||
                       !options_.master_addr.empty() || options_.master_port;
    if (given)
      fail(op, options_,
           s.launcher + " already started this process as a rank, so nproc_per_node, nnodes, node_rank, master_addr "
           "and master_port are the launcher's to decide: leave them unset (as ignite's Parallel wants under a "
           "launcher), or run the program without a launcher to have it spawn");
    init_here(options_, s);
    initialized_ = true;
    return;
  }
  if (options_.nproc_per_node.value_or(1) > 1 || options_.nnodes.value_or(1) > 1) {
    spawns_ = true;  // run() does
    return;
  }
  init({.backend = options_.backend, .recovery = options_.recovery});
  initialized_ = true;
}

Parallel::~Parallel() {
  // Unwinding from an exception (fn's, say): no finalize, which would wait for ranks that are
  // blocked in a collective with this one until the timeout.
  if (!initialized_ || std::uncaught_exceptions() > uncaught_at_start_) return;
  try {
    finalize();
  } catch (const std::exception& e) {
    // A peer was left waiting in a collective this rank never made (finalize's Error): the
    // process must not end with exit 0, and a destructor cannot throw.
    std::fprintf(stderr, "%s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
}

}  // namespace idist
