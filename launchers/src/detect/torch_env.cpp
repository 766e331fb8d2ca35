// torchrun-style variables that something already set (torchrun itself, an enroot/pyxis hook,
// a job script): validated and passed through.
#include "detectors.hpp"

namespace idist::launchers::detectors {

std::optional<Reading> read_torch_env(const Vars& vars) {
  if (!vars.text(env::kRank) && !vars.text(env::kWorldSize)) return std::nullopt;
  Reading r;
  r.launcher = "env";
  r.source = "torchrun-style env";
  // Either may be missing here: a hook under srun may set RANK alone, and then it need only
  // agree with SLURM. Only if this source wins must it be complete.
  r.rank = vars.integer(env::kRank);
  r.world_size = vars.integer(env::kWorldSize, 1);
  r.rank_variables = std::string(env::kRank);
  r.size_variables = std::string(env::kWorldSize);
  r.local_rank = vars.integer(env::kLocalRank);
  r.local_world_size = vars.integer(env::kLocalWorldSize, 1);
  r.one_node_by_default = true;
  r.local_variables = "LOCAL_RANK/LOCAL_WORLD_SIZE";
  const auto node = vars.integer(env::kNodeRank);
  const auto group = vars.integer(env::kGroupRank);
  if (node && group && node->value != group->value)
    vars.fail("NODE_RANK=" + std::to_string(node->value) + " and GROUP_RANK=" + std::to_string(group->value) +
              " disagree");
  r.node_rank = group ? group : node;
  r.nnodes = vars.integer(env::kGroupWorldSize, 1);
  for (std::string_view name : {"TORCHELASTIC_RUN_ID", "IDIST_RUN_ID"}) {
    if (auto id = vars.text(name)) {
      r.job_id = *id;
      r.job_id_from = std::string(name);
      break;
    }
  }
  read_exported_master(vars, r);
  if (r.master_port) {
    const auto port = *r.master_port;
    // torchrun's agent already serves its own store on MASTER_PORT (its workers connect as
    // clients): rank 0's store needs another port, derived alike on every rank.
    const auto agent_store = vars.text("TORCHELASTIC_USE_AGENT_STORE");
    if (agent_store && (*agent_store == "True" || *agent_store == "1") && !r.job_id.empty()) {
      r.job_id += ":" + std::to_string(port.value);
      if (auto restart = vars.integer("TORCHELASTIC_RESTART_COUNT")) r.step = static_cast<std::uint64_t>(restart->value);
      r.job_id_from += ", MASTER_PORT (torchrun's agent store) and TORCHELASTIC_RESTART_COUNT";
      r.master_port.reset();
    }
  }
  return r;
}

}  // namespace idist::launchers::detectors
