// A SLURM step: a task that srun started. The batch script of sbatch (and an salloc shell)
// has SLURM_PROCID=0 and SLURM_NTASKS=N too, but it is not rank 0 of N: only SLURM_STEP_ID
// tells a step.
#include <numeric>

#include "detectors.hpp"
#include "idist/launchers/hostlist.hpp"
#include "parse_whole.hpp"

namespace idist::launchers {
namespace {

// "1 node", "3 nodes": messages quote counts that are often 1.
std::string nodes(std::size_t n, const char* what = "node") {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

std::vector<int> expand_tasks_per_node(std::string_view variable, std::string_view text) {
  auto fail = [&](const std::string& why) -> void {
    throw DetectError(std::string(variable) + "='" + std::string(text) + "': " + why +
                      " (expected counts like 2(x3),1)");
  };
  auto number = [&](std::string_view digits) {
    const auto value = parse_whole<int>(digits);
    if (!value || *value < 1) fail("bad count '" + std::string(digits) + "'");
    return value.value_or(1);
  };
  std::vector<int> counts;
  std::string_view rest = text;
  if (rest.empty()) fail("empty");
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) fail("trailing comma");
    int repeat = 1;
    if (const auto open = item.find('('); open != std::string_view::npos) {
      if (item.size() < open + 4 || item.substr(open, 2) != "(x" || item.back() != ')') fail("bad repeat '" + std::string(item) + "'");
      repeat = number(item.substr(open + 2, item.size() - open - 3));
      item = item.substr(0, open);
    }
    const int count = number(item);
    if (counts.size() + static_cast<std::size_t>(repeat) > kMaxHosts) fail("more nodes than idist handles");
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), count);
  }
  return counts;
}

namespace detectors {

std::optional<Reading> read_slurm(const Vars& vars, std::vector<std::string>& notes) {
  const auto step = vars.text("SLURM_STEP_ID");
  if (!step) {
    if (auto job = vars.text("SLURM_JOB_ID"))
      notes.push_back("SLURM_JOB_ID=" + *job +
                      " is set but SLURM_STEP_ID is not: this is a batch script or an salloc shell, not a task "
                      "that srun started, so SLURM_PROCID and SLURM_NTASKS do not describe this process");
    return std::nullopt;
  }
  constexpr std::string_view because = "SLURM_STEP_ID is";
  Reading r;
  r.launcher = "slurm";
  r.source = "SLURM step";
  r.rank = vars.required("SLURM_PROCID", because);
  r.world_size = vars.first_integer({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}, 1);
  if (!r.world_size) vars.fail("SLURM_STEP_ID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS is");
  r.local_rank = vars.required("SLURM_LOCALID", because);
  r.node_rank = vars.required("SLURM_NODEID", because);
  r.nnodes = vars.first_integer({"SLURM_STEP_NUM_NODES", "SLURM_NNODES"}, 1);

  // Tasks per node can be uneven ("2(x3),1"); the node's own count is its local world size.
  for (std::string_view name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const auto text = vars.text(name);
    if (!text) continue;
    r.tasks_per_node = expand_tasks_per_node(name, *text);
    const long long total = std::accumulate(r.tasks_per_node.begin(), r.tasks_per_node.end(), 0LL);
    if (total != r.world_size->value)
      vars.fail(std::string(name) + "='" + *text + "' adds up to " + std::to_string(total) + " tasks but " +
                r.world_size->from + "=" + std::to_string(r.world_size->value));
    if (r.nnodes && static_cast<int>(r.tasks_per_node.size()) != r.nnodes->value)
      vars.fail(std::string(name) + "='" + *text + "' lists " + nodes(r.tasks_per_node.size()) + " but " + r.nnodes->from + "=" + std::to_string(r.nnodes->value));
    if (!r.nnodes) r.nnodes = Sourced<int>{static_cast<int>(r.tasks_per_node.size()), std::string(name)};
    if (r.node_rank->value >= static_cast<int>(r.tasks_per_node.size()))
      vars.fail("SLURM_NODEID=" + std::to_string(r.node_rank->value) + " but " + std::string(name) + "='" + *text +
                "' has only " + nodes(r.tasks_per_node.size()));
    r.local_world_size = Sourced<int>{r.tasks_per_node[static_cast<std::size_t>(r.node_rank->value)],
                                      std::string(name) + "[SLURM_NODEID]"};
    break;
  }
  r.local_variables = "SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE";

  // The step's node list, not the job's: the job's can start with a node the step does not use.
  for (std::string_view name : {"SLURM_STEP_NODELIST", "SLURM_NODELIST"}) {
    const auto text = vars.text(name);
    if (!text) continue;
    try {
      r.hosts = expand_hostlist(*text);
    } catch (const HostlistError& e) {
      vars.fail(std::string(name) + ": " + e.what());
    }
    if (r.hosts.empty()) vars.fail(std::string(name) + "='" + *text + "' names no host");
    if (r.nnodes && static_cast<int>(r.hosts.size()) != r.nnodes->value)
      vars.fail(std::string(name) + "='" + *text + "' has " + nodes(r.hosts.size(), "host") + " but " +
                r.nnodes->from + "=" + std::to_string(r.nnodes->value));
    // Task 0 runs on the step's first node under every distribution but arbitrary.
    r.master_addr = Sourced<std::string>{r.hosts.front(), "first host of " + std::string(name)};
    break;
  }

  if (auto job = vars.text("SLURM_JOB_ID")) {
    r.job_id = *job;
    if (const auto step_number = parse_whole<std::uint64_t>(*step))
      r.step = *step_number;
    else
      r.job_id += "." + *step;  // "batch", "extern", ...: part of the identity, not a number
    r.run_id = *job + "." + *step;
    r.job_id_from = "SLURM_JOB_ID and SLURM_STEP_ID";
  }
  return r;
}

}  // namespace detectors
}  // namespace idist::launchers
