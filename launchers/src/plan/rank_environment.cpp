// What each rank of a plan is given: its contract, its environment (the contract's variables,
// and the SLURM and torchelastic views that scripts written for srun and torchrun read) and its
// command line (plan.hpp's rank half).
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

#include "idist/launchers/plan.hpp"
#include "idist/launchers/program.hpp"
#include "parse_whole.hpp"
#include "plan_limits.hpp"

namespace idist::launchers {

env::Contract rank_contract(const LaunchPlan& plan, int index) {
  env::Contract c = plan.job;
  c.rank = plan.job.rank + index;
  c.local_rank = plan.job.local_rank + index;
  return c;
}

namespace {

// SLURM's compressed tasks-per-node form, as srun writes it: {2, 2, 2, 1} -> "2(x3),1".
std::string compress_tasks_per_node(const std::vector<int>& counts) {
  std::string out;
  for (std::size_t i = 0; i < counts.size();) {
    std::size_t run = 1;
    while (i + run < counts.size() && counts[i + run] == counts[i]) ++run;
    out += (out.empty() ? "" : ",") + std::to_string(counts[i]) + (run > 1 ? "(x" + std::to_string(run) + ")" : "");
    i += run;
  }
  return out;
}

// A rank idist-run spawns inside a SLURM task inherits the task's SLURM_PROCID, SLURM_LOCALID
// and SLURM_NTASKS. ignite.distributed and Lightning check those against RANK, LOCAL_RANK and
// WORLD_SIZE and refuse to start on more than one node when they differ. So each rank gets
// what srun would have exported had it started the rank as a task of its own: the task
// counts grow by the ranks each task spawns (node-major, as the contract numbers them), and
// the per-task values become the rank's. Only variables the task has are rewritten. Left as
// they are: SLURM_TASK_PID (the task is idist-run), SLURM_NODEID and the node's CPUs, and the
// variables srun also reads as options (SLURM_DISTRIBUTION, SLURM_CPUS_PER_TASK), which a
// nested srun would take up.
void set_slurm_task_view(std::map<std::string, std::string>& vars, const LaunchPlan& plan, const env::Contract& rank) {
  const auto set_if_present = [&](const char* name, const std::string& value) {
    if (const auto it = vars.find(name); it != vars.end()) it->second = value;
  };
  const int per_task = plan.local_count;
  set_if_present("SLURM_PROCID", std::to_string(rank.rank));
  set_if_present("SLURM_LOCALID", std::to_string(rank.local_rank));
  for (const char* name : {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"})
    set_if_present(name, std::to_string(rank.world_size));

  // Global task ids on this node: contiguous, as the contract puts a node's ranks together.
  std::string gtids;
  const int first_on_node = rank.rank - rank.local_rank;
  for (int i = 0; i < rank.local_world_size; ++i) gtids += (i ? "," : "") + std::to_string(first_on_node + i);
  set_if_present("SLURM_GTIDS", gtids);

  if (const auto it = vars.find("SLURM_NTASKS_PER_NODE"); it != vars.end()) {
    if (const auto n = parse_whole<long long>(it->second); n && *n >= 1 && *n <= kMaxRanks)
      it->second = std::to_string(*n * per_task);
  }
  // srun gives both the step's layout; detection read the first of them that is set.
  for (const char* source : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const auto it = vars.find(source);
    if (it == vars.end()) continue;
    std::optional<std::string> scaled;
    try {
      auto counts = expand_tasks_per_node(source, it->second);
      for (auto& c : counts) c *= per_task;
      scaled = compress_tasks_per_node(counts);
    } catch (const DetectError&) {
      // Detection refuses such a value, so only a base_environ other than what it read gets
      // here; no layout is then better than the task's, which would be wrong.
    }
    for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
      if (scaled)
        set_if_present(name, *scaled);
      else
        vars.erase(name);
    }
    break;
  }
}

// Ranks we spawn get ours; a task we become (exec) keeps what its launcher set (a torchrun
// above us knows its restarts better), and gets ours only where unset.
void set_torchelastic_view(std::map<std::string, std::string>& vars, const LaunchPlan& plan, const env::Contract& rank) {
  for (auto& [name, value] : torchelastic_variables(plan, rank)) {
    if (plan.mode == Mode::spawn)
      vars[name] = std::move(value);
    else
      vars.emplace(name, std::move(value));
  }
}

}  // namespace

// What torchrun's agent gives each worker beside the contract's variables
// (torch/distributed/elastic/agent/server/local_elastic_agent.py), which scripts written for
// torchrun read: one role ("default", torchrun's), so role rank and size are the global ones.
// GROUP_RANK and GROUP_WORLD_SIZE are the contract's own. Not set: TORCHELASTIC_USE_AGENT_STORE,
// since MASTER_PORT is rank 0's own store, not an agent's.
std::vector<std::pair<std::string, std::string>> torchelastic_variables(const LaunchPlan& plan,
                                                                        const env::Contract& rank) {
  return {
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(rank.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(plan.max_restarts)},
      {"TORCHELASTIC_RUN_ID", rank.run_id},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank.rank)},
      {"ROLE_WORLD_SIZE", std::to_string(rank.world_size)},
  };
}

std::vector<std::string> rank_environment(const LaunchPlan& plan, int index, char** base_environ) {
  std::map<std::string, std::string> vars;
  for (char** e = base_environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    vars[std::string(entry.substr(0, eq))] = std::string(entry.substr(eq + 1));
  }
  // A value inherited from an outer job must not leak into ours (ours re-sets what it keeps).
  // (IDIST_RECOVERY_STORE: only the idist-run that supervises the rank may offer recovery.)
  for (auto name : {env::kJobToken, env::kRunId, env::kLauncher, env::kRecoveryStore}) vars.erase(std::string(name));
  // Nor an outer job's flight recorder into ranks we spawn: they get ours. A rank we exec in
  // place is the outer job's, and keeps it.
  if (plan.mode == Mode::spawn) vars.erase(std::string(env::kRecorderFd));
  for (const auto& name : plan.unset) vars.erase(name);
  for (auto& [name, value] : env::to_variables(rank_contract(plan, index))) vars[name] = value;
  for (const auto& [name, value] : plan.rank_defaults) vars.emplace(name, value);
  if (plan.mode == Mode::spawn && plan.job.launcher == "slurm" && !plan.keep_slurm_env)
    set_slurm_task_view(vars, plan, rank_contract(plan, index));
  set_torchelastic_view(vars, plan, rank_contract(plan, index));
  // Ranks share the cores; without this every OpenMP runtime starts one thread per core.
  if (!vars.count(std::string(env::kOmpNumThreads)) && !plan.cpu_shares.empty()) {
    vars[std::string(env::kOmpNumThreads)] = std::to_string(plan.cpu_shares.at(static_cast<std::size_t>(index)).size());
  } else if (!vars.count(std::string(env::kOmpNumThreads))) {
    // The affinity mask, which srun or numactl may have narrowed.
    const auto mask = static_cast<unsigned>(usable_cpus().size());
    const unsigned all = std::max(1u, std::thread::hardware_concurrency());
    // Spawned ranks share our cores. A task the outer launcher bound (a mask narrower than the
    // machine) already has its own share; an unbound one shares the machine with its node's tasks.
    const unsigned share = plan.mode == Mode::spawn ? static_cast<unsigned>(plan.local_count)
                           : mask < all             ? 1u
                                                    : static_cast<unsigned>(std::max(1, plan.job.local_world_size));
    vars[std::string(env::kOmpNumThreads)] = std::to_string(std::max(1u, mask / share));
  }
  std::vector<std::string> out;
  out.reserve(vars.size());
  for (auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

std::vector<std::string> rank_command(const LaunchPlan& plan, int index) {
  auto command = plan.command;
  if (plan.local_rank_arg)
    command.insert(command.begin() + static_cast<long>(std::min(plan.program_words, command.size())),
                   "--local_rank=" + std::to_string(rank_contract(plan, index).local_rank));
  return command;
}

std::string attempt_token(const std::string& job_token, int attempt) {
  return job_token + "#" + std::to_string(attempt);
}

void apply_assignment(LaunchPlan& plan, int attempt, int node_rank, int nnodes, int world_size, int rank_base,
                      int master_port) {
  auto& job = plan.job;
  job.job_token = attempt_token(plan.rendezvous->token, attempt);
  job.node_rank = node_rank;
  job.nnodes = nnodes;
  job.world_size = world_size;
  job.rank = rank_base;
  job.master_port = master_port;
}

Attempt attempt_of(LaunchPlan& plan, const std::string& path, int restart_count, char** base_environ) {
  plan.job.restart_count = restart_count;
  if (restart_count > 0 && plan.port_reservation) {
    // Taken while the old reservation is still held, so the two differ.
    auto fresh = std::make_shared<PortReservation>(plan.job.master_addr, plan.provenance["master_addr"]);
    plan.job.master_port = fresh->port();
    plan.port_reservation = std::move(fresh);
  }
  Attempt attempt;
  attempt.master_port = plan.job.master_port;
  if (plan.rendezvous) attempt.node_rank = plan.job.node_rank;
  for (int local = 0; local < plan.local_count; ++local) {
    ProcessSpec process;
    process.rank = rank_contract(plan, local).rank;
    process.path = path;
    process.argv = rank_command(plan, local);
    process.env = rank_environment(plan, local, base_environ);
    if (!plan.cpu_shares.empty()) process.cpus = plan.cpu_shares[static_cast<std::size_t>(local)];
    attempt.processes.push_back(std::move(process));
  }
  return attempt;
}

std::string random_token(std::size_t bytes) {
  std::string raw(bytes, '\0');
  std::size_t got = 0;
  while (got < bytes) {
    const auto n = ::getrandom(raw.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<std::size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : raw) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

}  // namespace idist::launchers
