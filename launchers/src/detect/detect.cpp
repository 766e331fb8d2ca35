// The detectors in priority order, the agreement check between the sources that are present,
// and the completion of the winner's reading into a Detected.
#include <functional>

#include "detectors.hpp"
#include "parse_whole.hpp"

namespace idist::launchers {
namespace detectors {

void Vars::fail(const std::string& what) const { throw DetectError(source_ + ": " + what); }

std::optional<Sourced<int>> Vars::integer(std::string_view name, int min) const {
  const auto value = lookup_(name);
  if (!value) return std::nullopt;
  const auto out = parse_whole<int>(*value);
  if (!out || *out < min)
    fail(std::string(name) + "='" + *value + "' is not " + (min == 0 ? "a non-negative integer" : "a positive integer"));
  return Sourced<int>{*out, std::string(name)};
}

std::optional<Sourced<int>> Vars::port(std::string_view name) const {
  const auto value = lookup_(name);
  if (!value) return std::nullopt;
  const auto out = parse_whole<int>(*value);
  if (!out || *out < 1 || *out > 65535) fail(std::string(name) + "='" + *value + "' is not a port (1 to 65535)");
  return Sourced<int>{*out, std::string(name)};
}

std::optional<Sourced<int>> Vars::first_integer(std::initializer_list<std::string_view> names, int min) const {
  for (auto name : names)
    if (auto value = integer(name, min)) return value;
  return std::nullopt;
}

Sourced<int> Vars::required(std::string_view name, std::string_view because, int min) const {
  auto value = integer(name, min);
  if (!value) fail(std::string(because) + " set but " + std::string(name) + " is not");
  return *value;
}

void read_exported_master(const Vars& vars, Reading& r) {
  if (auto addr = vars.text(env::kMasterAddr); addr && !addr->empty())
    r.master_addr = Sourced<std::string>{*addr, std::string(env::kMasterAddr)};
  if (auto port = vars.port(env::kMasterPort)) r.master_port = port;
}

}  // namespace detectors

namespace {

using detectors::Reading;
using detectors::Vars;

struct Detector {
  std::string_view launcher;
  std::string_view source;
  std::function<std::optional<Reading>(const Vars&, std::vector<std::string>&)> read;
};

// The documented priority; the first that matches wins.
const std::vector<Detector>& all_detectors() {
  using namespace detectors;
  static const std::vector<Detector> table = {
      {"slurm", "SLURM step", [](auto& v, auto& notes) { return read_slurm(v, notes); }},
      {"mpi", kOpenMpi.source, [](auto& v, auto&) { return read_mpi(kOpenMpi, v); }},
      {"mpi", kPmix.source, [](auto& v, auto&) { return read_mpi(kPmix, v); }},
      {"mpi", "MPICH/Intel MPI", [](auto& v, auto&) { return read_hydra(v); }},
      {"mpi", kMvapich.source, [](auto& v, auto&) { return read_mpi(kMvapich, v); }},
      {"horovod", "horovodrun", [](auto& v, auto&) { return read_horovod(v); }},
      {"env", "torchrun-style env", [](auto& v, auto&) { return read_torch_env(v); }},
  };
  return table;
}

// Two sources that both say a value must say the same one.
void check_agreement(const Reading& winner, const Reading& other) {
  using Field = std::optional<Sourced<int>> Reading::*;
  for (Field field : {&Reading::rank, &Reading::world_size, &Reading::local_rank, &Reading::local_world_size,
                      &Reading::node_rank, &Reading::nnodes}) {
    const auto& a = winner.*field;
    const auto& b = other.*field;
    if (!a || !b || a->value == b->value) continue;
    std::string hint = "unset the stale one, or pick the source with --launcher";
    if (winner.launcher == "slurm" && other.launcher == "mpi")
      hint = "mpirun inside a SLURM allocation starts its daemons as a SLURM step: use --launcher mpi";
    throw DetectError(describe(*a) + " (" + winner.source + ") and " + describe(*b) + " (" + other.source +
                      ") disagree; " + hint);
  }
}

[[noreturn]] void incomplete(const Reading& r, const std::string& what) {
  std::string hint;
  if (r.launcher == "env")  // RANK/WORLD_SIZE left over in a shell break plain `idist-run -n 2` otherwise
    hint = " (left over in your shell? unset them, or set IDIST_NO_DETECT=1)";
  throw DetectError(r.source + ": " + what + hint);
}

// Fills in what the winner's variables do not say, or fails naming what is missing.
Detected complete(Reading r) {
  if (!r.rank) incomplete(r, describe(*r.world_size) + " is set but " + r.rank_variables + " is not");
  if (!r.world_size)
    incomplete(r, describe(*r.rank) + " is set but " + r.size_variables + " is not, so the world size is unknown");
  if (!r.local_rank || !r.local_world_size) {
    if (!r.one_node_by_default)
      incomplete(r, r.local_variables + " not set: cannot tell which ranks share this node");
    if (!r.local_world_size) {
      if (!r.nnodes || r.nnodes->value == 1) {
        // torch's reading of a bare RANK/WORLD_SIZE: every rank on one node.
        r.local_world_size = Sourced<int>{r.world_size->value, r.world_size->from + " (one node assumed)"};
      } else if (r.world_size->value % r.nnodes->value == 0) {
        r.local_world_size = Sourced<int>{r.world_size->value / r.nnodes->value,
                                          r.world_size->from + " / " + r.nnodes->from};
      } else {
        incomplete(r, describe(*r.world_size) + " ranks do not split evenly over " + describe(*r.nnodes) +
                          " nodes; set " + r.local_variables);
      }
    }
    if (!r.local_rank)
      r.local_rank = Sourced<int>{r.rank->value % r.local_world_size->value,
                                  r.rank->from + " mod " + r.local_world_size->from};
  }
  const int world = r.world_size->value;
  const int local_world = r.local_world_size->value;
  if (r.rank->value >= world) incomplete(r, describe(*r.rank) + " is not below " + describe(*r.world_size));
  if (local_world > world) incomplete(r, describe(*r.local_world_size) + " is more than " + describe(*r.world_size));
  if (r.local_rank->value >= local_world)
    incomplete(r, describe(*r.local_rank) + " is not below " + describe(*r.local_world_size));

  if (!r.node_rank) {
    // MPI launchers do not say which node a rank is on. rank / local size is right for the
    // placement mpirun uses by default (by slot, nodes filled in order, all alike); an uneven
    // layout would give ranks different answers, so it is refused rather than guessed.
    const bool even = world % local_world == 0 && (!r.nnodes || r.nnodes->value * local_world == world);
    if (local_world == world) {
      r.node_rank = Sourced<int>{0, "one node (" + r.local_world_size->from + " = " + r.world_size->from + ")"};
    } else if (even) {
      r.node_rank = Sourced<int>{r.rank->value / local_world, r.rank->from + " / " + r.local_world_size->from +
                                                                  " (assumes ranks are placed node by node)"};
    } else {
      incomplete(r, describe(*r.world_size) + " with " + describe(*r.local_world_size) + " on this node" +
                        (r.nnodes ? " and " + describe(*r.nnodes) : std::string()) +
                        ": the nodes hold different numbers of ranks, and the launcher does not say which node "
                        "this is; place ranks evenly (mpirun --map-by ppr:K:node)");
    }
  }
  if (!r.nnodes) {
    if (local_world == world)
      r.nnodes = Sourced<int>{1, "one node (" + r.local_world_size->from + " = " + r.world_size->from + ")"};
    else
      r.nnodes = Sourced<int>{world / local_world, r.world_size->from + " / " + r.local_world_size->from};
  }
  if (r.node_rank->value >= r.nnodes->value) incomplete(r, describe(*r.node_rank) + " is not below " + describe(*r.nnodes));

  Detected d;
  d.launcher = r.launcher;
  d.source = r.source;
  d.rank = *r.rank;
  d.world_size = *r.world_size;
  d.local_rank = *r.local_rank;
  d.local_world_size = *r.local_world_size;
  d.node_rank = *r.node_rank;
  d.nnodes = *r.nnodes;
  d.master_addr = r.master_addr;
  d.master_port = r.master_port;
  d.hosts = std::move(r.hosts);
  d.tasks_per_node = std::move(r.tasks_per_node);
  d.run_id = r.run_id.empty() ? r.job_id : r.run_id;
  d.job_id = std::move(r.job_id);
  d.step = r.step;
  d.job_id_from = std::move(r.job_id_from);
  d.one_node_assumed = r.one_node_by_default && r.local_world_size->from.ends_with("(one node assumed)");
  return d;
}

}  // namespace

std::string describe(const Sourced<int>& v) {
  const bool variable = !v.from.empty() && v.from.find_first_of(" ([") == std::string::npos;
  return variable ? v.from + "=" + std::to_string(v.value) : std::to_string(v.value) + " (" + v.from + ")";
}

namespace {

// Hydra keeps the job's name (and, with -pmi-port, rank and size) in its PMI server. Asked
// only when something is missing, because under PMI_FD the question ends the PMI session that
// an MPICH program would otherwise use itself (pmi.hpp).
void ask_pmi(Reading& r, const DetectOptions& options) {
  const bool topology_missing = !r.rank || !r.world_size;
  const bool id_missing = options.job_id_needed && r.job_id.empty() && !r.master_port;
  if (!topology_missing && !id_missing) return;
  const auto answer = options.pmi(*r.pmi);
  const auto take = [&](std::optional<Sourced<int>>& field, const std::optional<int>& value, const char* name) {
    if (!value) return;
    const Sourced<int> from_server{*value, "the PMI server (" + r.pmi->from + ")"};
    if (field && field->value != *value)
      throw DetectError(describe(*field) + " and " + name + " " + std::to_string(*value) + " from " + from_server.from +
                        " disagree; unset the stale one");
    if (!field) field = from_server;
  };
  take(r.rank, answer.rank, "rank");
  take(r.world_size, answer.size, "size");
  r.job_id = answer.kvsname;
  r.run_id = answer.kvsname;
  r.job_id_from = "the PMI server's job name (" + r.pmi->from + ")";
}

}  // namespace

Detection detect(const env::Lookup& env, const DetectOptions& options) {
  const std::string_view launcher = options.launcher;
  Detection out;
  const bool forced = launcher != "auto";
  // A PyTorchJob pod's RANK and WORLD_SIZE place the pod, not a rank (detect/pytorchjob.cpp):
  // the torchrun-style reading of them would be wrong, so the pod's reading is the answer.
  if (!forced) {
    if (auto pod = detect_pytorchjob(env)) {
      out.pod = std::move(pod);
      return out;
    }
  }
  std::vector<Reading> readings;
  for (const auto& detector : all_detectors()) {
    try {
      if (auto reading = detector.read(Vars(env, std::string(detector.source)), out.notes))
        readings.push_back(std::move(*reading));
    } catch (const DetectError& e) {
      // A forced choice does not depend on the other kinds' variables, broken or not.
      if (!forced || detector.launcher == launcher) throw;
      out.notes.push_back("ignoring " + std::string(detector.source) + " variables (--launcher " +
                          std::string(launcher) + "): " + e.what());
    }
  }

  // A source that cannot place this process alone (PMIx puts no size in the environment) still
  // has to agree with the others, but does not win on its own. One with a PMI server can ask it.
  Reading* winner = nullptr;
  const Reading* partial = nullptr;
  for (auto& r : readings) {
    if (forced && r.launcher != launcher) continue;
    if (r.size_optional && !r.world_size && !r.pmi) {
      if (!partial) partial = &r;
      out.notes.push_back(r.source + ": " + describe(*r.rank) + " is set but " + r.size_variables +
                          " is not, which is not enough to place this process");
      continue;
    }
    winner = &r;
    break;
  }
  if (!winner) {
    if (forced && partial) complete(*partial);  // throws, saying what is missing
    if (forced)
      throw DetectError("--launcher " + std::string(launcher) + ": no " + std::string(launcher) +
                        " variables in the environment");
    if (const auto marks = env::launcher_marks(env); !marks.empty() && !partial) {
      std::string list;
      for (const auto& m : marks) list += (list.empty() ? "" : ", ") + m;
      throw DetectError("an outer launcher's variables are set (" + list +
                        ") but do not say this process's rank and the world size; start idist-run the way that "
                        "launcher starts tasks, or pass --launcher spawn (IDIST_NO_DETECT=1) to ignore them");
    }
    if (partial) complete(*partial);  // a world of one would be a silent wrong answer: say what is missing
    return out;
  }
  Reading chosen = *winner;
  if (chosen.launcher != "env")  // the torchrun-style source reads them itself (torch_env.cpp)
    detectors::read_exported_master(Vars(env, chosen.source), chosen);
  if (chosen.pmi) ask_pmi(chosen, options);
  for (const auto& r : readings) {
    if (&r == winner) continue;
    // A forced choice overrides the other kinds of launcher; sources of its own kind must still agree.
    if (forced && r.launcher != chosen.launcher) {
      out.notes.push_back("ignoring " + r.source + " variables: --launcher " + std::string(launcher));
      continue;
    }
    check_agreement(chosen, r);
  }
  out.found = complete(std::move(chosen));
  return out;
}

}  // namespace idist::launchers
