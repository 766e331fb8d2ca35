// --dry-run: the plan as one JSON object, for people and for scripts (jq).
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <string>

#include "idist/env_contract.hpp"

#include "idist/launchers/plan.hpp"
#include "idist/launchers/resources.hpp"

namespace idist::launchers {

namespace {

// What IDIST_INTERHOST `setting` comes to, as far as this host can tell: every member must be
// able to run UCX for auto to take it, so only a "gloo" is certain from here.
std::string interhost_choice(const std::string& setting, const UcxHere& ucx, const env::Contract& job) {
  if (setting != "auto" && setting != "ucx" && setting != "gloo")
    return "none: IDIST_INTERHOST='" + setting + "' is not auto, ucx or gloo, so every rank refuses it at init";
  // Only a gloo job's traffic between hosts is carried this way (an empty backend: the
  // program's choice, gloo by default).
  if (job.nnodes <= 1) return "not used (one host)";
  if (!job.backend.empty() && job.backend != "gloo") return "not used (the " + job.backend + " backend carries its own)";
  if (setting == "gloo") return "gloo";
  if (setting == "ucx")
    return ucx.loads ? "ucx (required: a rank whose host cannot start UCX fails at init, saying why)"
                     : "none: ucx is required but this host cannot run it (" + ucx.detail +
                           "), so every rank here fails at init; install libucx and the ucx plugin, or set "
                           "IDIST_INTERHOST=auto or gloo";
  return ucx.loads ? "ucx where every host's ranks can start UCX, as this host's can (" + ucx.detail +
                         "), else gloo; idist-run -v prints the ranks' choice"
                   : "gloo: this host cannot run ucx (" + ucx.detail + ")";
}

}  // namespace

std::string dry_run_json(const LaunchPlan& plan, const UcxHere& ucx) {
  using json = nlohmann::ordered_json;  // keys in the order written: launcher first
  const auto& job = plan.job;
  json out;
  out["launcher"] = job.launcher;
  out["mode"] = plan.mode == Mode::exec ? "exec" : "spawn";
  out["detected_by"] = plan.detected_by.empty() ? json(nullptr) : json(plan.detected_by);
  out["backend"] = job.backend.empty() ? json(nullptr) : json(job.backend);  // null: the program's choice
  out["world_size"] = job.world_size;
  out["nnodes"] = job.nnodes;
  out["node_rank"] = job.node_rank;
  out["local_world_size"] = job.local_world_size;
  out["master_addr"] = job.master_addr;
  out["master_port"] = job.master_port == 0 ? json(nullptr) : json(job.master_port);  // null: picked at launch
  // Several nodes: where they meet; the ranks, world size and port above are what this node
  // expects (every node with its -n), the rendezvous decides them for each attempt.
  if (const auto& r = plan.rendezvous)
    out["rendezvous"] = {{"host", r->host},
                         {"port", r->port},
                         {"min_nodes", r->min_nodes},
                         {"max_nodes", r->max_nodes},
                         {"node_rank", r->node_rank ? json(*r->node_rank) : json(nullptr)}};
  out["hosts"] = plan.hosts;
  out["provenance"] = plan.provenance;
  out["run_id"] = job.run_id;
  out["command"] = plan.command;
  out["notes"] = plan.notes;
  json cpus = json::array();
  for (const auto& share : plan.cpu_shares) cpus.push_back(cpu_list(share));
  // Between hosts: the setting, and what it comes to as far as this host can tell; the choice
  // itself is the ranks' at init, among every host's (idist-run -v says it).
  const char* interhost = std::getenv(std::string(env::kInterhost).c_str());
  const bool set = interhost != nullptr && *interhost != '\0';
  const std::string setting = set ? interhost : "auto";
  out["interhost"] = {{"setting", setting},
                      {"from", set ? std::string(env::kInterhost) : "default"},
                      {"used", job.nnodes > 1 ? "between hosts: the hosts' leaders, and groups of one rank per host"
                                              : "no (one host)"},
                      {"auto", env::kInterhostAuto},
                      {"choice", interhost_choice(setting, ucx, job)}};
  out["binding"] = {{"bound", !plan.cpu_shares.empty()}, {"why", plan.binding}, {"cpus", std::move(cpus)}};
  json ranks = json::array();
  for (int i = 0; i < plan.local_count; ++i) {
    const auto contract = rank_contract(plan, i);
    json vars = json::object();
    for (const auto& [name, value] : env::to_variables(contract)) {
      if (name == env::kJobToken)
        vars[name] = "<hidden>";  // a secret has no business in a log
      else if (name == env::kMasterPort && contract.master_port == 0)
        vars[name] = "<picked at launch>";
      else
        vars[name] = value;
    }
    for (const auto& [name, value] : torchelastic_variables(plan, contract)) vars[name] = value;
    for (const auto& [name, value] : plan.rank_defaults)
      if (!vars.contains(name)) vars[name] = value;
    json rank = {{"rank", contract.rank}, {"local_rank", contract.local_rank}, {"env", std::move(vars)}};
    if (plan.local_rank_arg) rank["command"] = rank_command(plan, i);
    ranks.push_back(std::move(rank));
  }
  out["ranks"] = std::move(ranks);
  // Arguments need not be UTF-8; replace what is not rather than fail.
  return out.dump(2, ' ', false, json::error_handler_t::replace);
}

}  // namespace idist::launchers
