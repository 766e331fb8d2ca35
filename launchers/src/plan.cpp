#include "idist/launchers/plan.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "idist/common/hash.hpp"
#include "idist/common/host.hpp"
#include "idist/launchers/config.hpp"
#include "idist/launchers/program.hpp"
#include "idist/launchers/resources.hpp"
#include "parse_whole.hpp"

namespace idist::launchers {
namespace {

std::string this_host() { return common::host_name("localhost"); }

constexpr const char* kPythonUnbuffered = "PYTHONUNBUFFERED";

// What the env contract accepts (env_contract.cpp).
constexpr int kMaxRanks = 1 << 24;

std::string join_counts(const std::vector<int>& counts) {
  std::string out;
  for (std::size_t i = 0; i < counts.size() && i < 16; ++i) out += (i ? "," : "") + std::to_string(counts[i]);
  if (counts.size() > 16) out += ",...";
  return out;
}

std::string count_text(int n, std::string_view what) {
  return std::to_string(n) + " " + std::string(what) + (n == 1 ? "" : "s");
}

// The run id of a job named by --rdzv-id: IDIST_RUN_ID goes into log directories and
// summaries, so it carries a hash of the id (which is the job's secret), not the id itself.
std::string rdzv_run_id(const std::string& rdzv_id) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(common::fnv1a(rdzv_id)));
  return "rdzv-" + std::string(hex, 12);
}

// One node of a job without a scheduler: plain `-n K` (N = 1) or torchrun's static rendezvous.
LaunchPlan static_plan(const LaunchOptions& o, const env::Lookup& env) {
  if (o.node_rank && !o.nnodes) throw UsageError("--node-rank needs --nnodes (the number of nodes in the job)");
  if (o.rdzv_endpoint && !o.nnodes) throw UsageError("--rdzv-endpoint needs --nnodes (N, or MIN:MAX)");
  const int nnodes = o.nnodes.value_or(1);
  const int min_nodes = o.min_nodes.value_or(nnodes);
  const bool several = nnodes > 1 || o.rdzv_endpoint;
  const int node_rank = o.node_rank.value_or(0);
  const int k = o.nproc_per_node.value_or(1);
  if (node_rank >= nnodes)
    throw UsageError("--node-rank " + std::to_string(node_rank) + " is not below --nnodes " + std::to_string(nnodes));
  if (o.node_rank && min_nodes < nnodes)
    throw UsageError("--node-rank does not go with --nnodes MIN:MAX: an elastic job ranks its nodes itself");
  if (nnodes > 1 && !o.master_addr && !o.rdzv_endpoint)
    throw UsageError("--nnodes " + std::to_string(nnodes) +
                     " needs --rdzv-endpoint HOST[:PORT] (or --master-addr): where the nodes meet, the same on every node");
  if (o.rdzv_endpoint && o.master_addr)
    throw UsageError("--rdzv-endpoint and --master-addr both name node 0: give one (rank 0 runs where the rendezvous is)");
  if (static_cast<long long>(nnodes) * k > kMaxRanks)
    throw UsageError("--nnodes " + std::to_string(nnodes) + " x --nproc-per-node " + std::to_string(k) +
                     " ranks is more than idist handles");

  LaunchPlan plan;
  plan.mode = Mode::spawn;
  plan.local_count = k;
  plan.command = o.command;
  auto& job = plan.job;
  job.launcher = "spawn";
  job.backend = o.backend;
  job.world_size = nnodes * k;
  job.nnodes = nnodes;
  job.node_rank = node_rank;
  job.local_world_size = k;
  job.rank = node_rank * k;
  job.local_rank = 0;
  job.master_addr = o.master_addr.value_or("127.0.0.1");
  if (several) {
    RendezvousPlan r;
    r.min_nodes = min_nodes;
    r.max_nodes = nnodes;
    r.node_rank = o.node_rank;
    if (o.rdzv_endpoint) {
      const auto& e = *o.rdzv_endpoint;
      const auto colon = e.rfind(':');
      r.host = colon == std::string::npos ? e : e.substr(0, colon);
      r.port = kDefaultRendezvousPort;
      if (colon != std::string::npos) {
        const auto digits = e.substr(colon + 1);
        int port = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
        if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || port < 1 || port > 65535)
          throw UsageError("--rdzv-endpoint '" + e + "': the port is not a number from 1 to 65535 (HOST[:PORT])");
        r.port = port;
      }
      if (r.host.empty()) throw UsageError("--rdzv-endpoint '" + e + "': no host (HOST[:PORT])");
    } else {
      r.host = *o.master_addr;
      r.port = o.master_port.value_or(kDefaultMasterPort);
    }
    job.master_addr = r.host;
    plan.rendezvous = r;
  }
  const std::string k_from = o.nproc_per_node ? "--nproc-per-node" : "default (1 process)";
  auto& from = plan.provenance;
  from["master_addr"] = o.master_addr ? "--master-addr" : "default (127.0.0.1: one node)";
  if (several) {
    job.master_port = 0;
    from["master_port"] = "a free port on node 0, new for every attempt (the rendezvous tells every node)";
  } else if (o.master_port) {
    job.master_port = *o.master_port;
    from["master_port"] = "--master-port";
  } else if (nnodes == 1) {
    // Every rank is here: a free port, held from now until rank 0 listens on it.
    if (!o.dry_run) {
      plan.port_reservation = std::make_shared<PortReservation>(job.master_addr, from["master_addr"]);
      job.master_port = plan.port_reservation->port();
    }
    from["master_port"] = "a free port on this host, reserved at launch";
  } else {
    job.master_port = kDefaultMasterPort;
    from["master_port"] = "default (29500, as torchrun)";
  }

  if (!several) {
    from["rank"] = "local index (0 to " + std::to_string(k - 1) + ")";
    from["world_size"] = k_from;
    from["node_rank"] = "default (one node)";
    from["nnodes"] = "default (one node)";
    job.run_id = o.rdzv_id ? rdzv_run_id(*o.rdzv_id) : random_token(6);
    job.job_token = random_token();
  } else {
    from["rank"] = "the ranks of the nodes below this one (the rendezvous) + local index";
    from["world_size"] = "the ranks of every node in the attempt (the rendezvous)";
    from["node_rank"] = o.node_rank ? "--node-rank" : "the rendezvous (node 0 hosts it; the others by host name)";
    from["nnodes"] = min_nodes < nnodes ? "--nnodes MIN:MAX: the nodes in the attempt (the rendezvous)" : "--nnodes";
    from["master_addr"] = o.rdzv_endpoint ? "--rdzv-endpoint (node 0 hosts the rendezvous and rank 0)" : "--master-addr";
    // Every node must agree on these without talking first. Without a shared secret, rank 0's
    // store would take orders from any process that reaches it, so one is required.
    const auto token = env(env::kJobToken);
    if ((!token || token->empty()) && !o.rdzv_id)
      throw UsageError("--nnodes " + std::to_string(nnodes) +
                       " without a scheduler needs the job's identity on every node, so that no other process can "
                       "join or end it: pass --rdzv-id ID (the same random id on every node, e.g. $(openssl rand -hex "
                       "8)) or export IDIST_JOB_TOKEN");
    job.job_token = token && !token->empty() ? *token : *o.rdzv_id;
    job.run_id = env(env::kRunId).value_or(
        o.rdzv_id ? rdzv_run_id(*o.rdzv_id)
                  : "static-" + job.master_addr + "-" + std::to_string(plan.rendezvous->port));
    plan.rendezvous->token = job.job_token;
  }
  from["local_rank"] = "local index (0 to " + std::to_string(k - 1) + ")";
  from["local_world_size"] = k_from;
  plan.hosts = {this_host()};
  return plan;
}

// A bare RANK/WORLD_SIZE/MASTER_ADDR is also what an older PyTorchJob gives each pod, where
// they count pods: the refusal says how to tell idist-run that this is such a pod.
std::string kubernetes_hint(const Detected& d) {
  return "; in a Kubeflow PyTorchJob pod (" + d.rank.from + " and " + d.world_size.from +
         " count pods) set nprocPerNode in the job's spec (PET_NPROC_PER_NODE), or pass --nnodes $" + d.world_size.from +
         " --node-rank $" + d.rank.from + " --master-addr $MASTER_ADDR --master-port $MASTER_PORT";
}

// Inside an outer launcher: become its task (exec) or spawn -n ranks as its node.
LaunchPlan outer_plan(const LaunchOptions& o, const Detected& d, const env::Lookup& env) {
  LaunchPlan plan;
  plan.detected_by = d.source;
  plan.command = o.command;
  auto& job = plan.job;
  auto& from = plan.provenance;
  job.launcher = d.launcher;
  job.backend = o.backend;
  job.nnodes = d.nnodes.value;
  job.node_rank = d.node_rank.value;
  from["nnodes"] = d.nnodes.from;
  from["node_rank"] = d.node_rank.from;

  const int k = o.nproc_per_node.value_or(1);
  if (k == 1) {
    plan.mode = Mode::exec;
    plan.local_count = 1;
    job.rank = d.rank.value;
    job.world_size = d.world_size.value;
    job.local_rank = d.local_rank.value;
    job.local_world_size = d.local_world_size.value;
    from["rank"] = d.rank.from;
    from["world_size"] = d.world_size.from;
    from["local_rank"] = d.local_rank.from;
    from["local_world_size"] = d.local_world_size.from;
  } else {
    // Judged on the busiest node, not this one, so that every task of an uneven job refuses
    // alike instead of some starting and then waiting for the others until the timeout.
    int most_tasks = d.local_world_size.value;
    std::string most_from = describe(d.local_world_size);
    if (!d.tasks_per_node.empty()) {
      most_tasks = *std::max_element(d.tasks_per_node.begin(), d.tasks_per_node.end());
      most_from = "tasks per node " + join_counts(d.tasks_per_node);
    }
    if (most_tasks > 1 && !o.force_spawn)
      throw UsageError(d.source + " runs up to " + count_text(most_tasks, "task") + " on a node (" + most_from +
                       ") and each asks for -n " + std::to_string(k) + ": " +
                       std::to_string(static_cast<long long>(most_tasks) * k) + " ranks on that node; start one task per node (srun --ntasks-per-node=1, "
                       "mpirun --map-by ppr:1:node), or drop -n to run one rank per task; --force-spawn starts them anyway" +
                       (d.one_node_assumed ? kubernetes_hint(d) : std::string()));
    if (static_cast<long long>(d.world_size.value) * k > kMaxRanks)
      throw UsageError(describe(d.world_size) + " tasks x --nproc-per-node " + std::to_string(k) +
                       " ranks is more than idist handles (" + std::to_string(kMaxRanks) + ")");
    plan.mode = Mode::spawn;
    plan.local_count = k;
    // Node-major: the tasks on earlier nodes come first, where the launcher says how many there are.
    int tasks_before = d.rank.value;
    std::string before_from = d.rank.from;
    if (!d.tasks_per_node.empty()) {
      const auto node = static_cast<std::size_t>(d.node_rank.value);
      tasks_before = static_cast<int>(std::accumulate(d.tasks_per_node.begin(),
                                                      d.tasks_per_node.begin() + static_cast<long>(node), 0LL)) +
                     d.local_rank.value;
      before_from = "tasks on earlier nodes + " + d.local_rank.from;
    }
    job.rank = tasks_before * k;
    job.world_size = d.world_size.value * k;
    job.local_rank = d.local_rank.value * k;
    job.local_world_size = d.local_world_size.value * k;
    from["rank"] = "(" + before_from + ") x --nproc-per-node + local index";
    from["world_size"] = d.world_size.from + " x --nproc-per-node";
    from["local_rank"] = d.local_world_size.value == 1 ? "local index" : d.local_rank.from + " x --nproc-per-node + local index";
    from["local_world_size"] = d.local_world_size.value == 1 ? "--nproc-per-node" : d.local_world_size.from + " x --nproc-per-node";
  }

  // Where rank 0 runs: what the user says, else what the launcher says, else here when every rank is.
  if (o.master_addr) {
    job.master_addr = *o.master_addr;
    from["master_addr"] = "--master-addr";
  } else if (d.master_addr) {
    job.master_addr = d.master_addr->value;
    from["master_addr"] = d.master_addr->from;
  } else if (d.local_world_size.value == d.world_size.value) {
    job.master_addr = "127.0.0.1";
    from["master_addr"] = "every rank on this node (" + d.local_world_size.from + " = " + d.world_size.from + ")";
  } else {
    throw UsageError(d.source + " runs ranks on several hosts (" + d.world_size.from + "=" +
                     std::to_string(d.world_size.value) + ", " + d.local_world_size.from + "=" +
                     std::to_string(d.local_world_size.value) +
                     ") and does not say where rank 0 runs: pass --master-addr with rank 0's host");
  }

  if (o.master_port) {
    job.master_port = *o.master_port;
    from["master_port"] = "--master-port";
  } else if (d.master_port) {
    job.master_port = d.master_port->value;
    from["master_port"] = d.master_port->from;
  } else if (o.rdzv_id || !d.job_id.empty()) {
    // torchrun's agent store owns MASTER_PORT (torch_env.cpp): our ranks' MASTER_PORT is rank
    // 0's own store, which torch programs must then create rather than join.
    if (d.launcher == "env" && env("TORCHELASTIC_USE_AGENT_STORE")) plan.unset.push_back("TORCHELASTIC_USE_AGENT_STORE");
    job.master_port = o.rdzv_id ? derived_port(*o.rdzv_id, 0, o.port_range) : derived_port(d.job_id, d.step, o.port_range);
    from["master_port"] = "derived from " + (o.rdzv_id ? std::string("--rdzv-id") : d.job_id_from) +
                          " into --port-range " + std::to_string(o.port_range.first) + "-" +
                          std::to_string(o.port_range.last);
  } else if (d.world_size.value == 1) {
    // The job's only task: every rank is here, so any free port will do, held until rank 0 listens.
    if (!o.dry_run) {
      plan.port_reservation = std::make_shared<PortReservation>(job.master_addr, from["master_addr"]);
      job.master_port = plan.port_reservation->port();
    }
    from["master_port"] = "a free port on this host, reserved at launch (the job's only task)";
  } else {
    // A fixed default would be the same for every such job on a host: two of them would meet,
    // and torch programs (which check no token) would mix their sums and exit 0.
    throw UsageError(d.source + " gives nothing that identifies this job (" + describe(d.world_size) +
                     "), so rank 0's port cannot be derived and two jobs on one host would meet: pass --master-port "
                     "PORT or --rdzv-id ID, the same on every task and unique to this job");
  }

  // Every rank must agree on these without talking first, so they come from the job's identity.
  if (o.rdzv_id)
    job.run_id = rdzv_run_id(*o.rdzv_id);
  else if (!d.run_id.empty())
    job.run_id = d.launcher + "-" + d.run_id;
  else
    job.run_id = env(env::kRunId).value_or(d.launcher + "-" + job.master_addr + "-" + std::to_string(job.master_port));
  job.job_token = env(env::kJobToken).value_or("");
  if (job.job_token.empty() && o.rdzv_id) {
    job.job_token = *o.rdzv_id;
  } else if (job.job_token.empty() && plan.mode == Mode::spawn && d.world_size.value == 1) {
    job.job_token = random_token();  // the job's only task: every rank is our child, so we can make one up
  } else if (job.job_token.empty() && !d.job_id.empty()) {
    // Not a secret (anyone who knows the job id can compute it), but it keeps two jobs apart: a
    // rank that reaches another job's store is refused at once instead of joining it.
    job.job_token = "job-" + std::to_string(common::fnv1a(d.job_id + "." + std::to_string(d.step)));
    plan.notes.push_back("IDIST_JOB_TOKEN is not set: rank 0's store admits clients that present this job's id ("
                         "derived from " + d.job_id_from + "), which keeps jobs apart but is no secret; export a "
                         "secret to the job (the same for every task) to require it");
  } else if (job.job_token.empty()) {
    plan.notes.push_back("IDIST_JOB_TOKEN is not set: rank 0's store accepts any client that reaches it; export a "
                         "secret to the job (the same for every task) to require it");
  }
  plan.hosts = d.hosts.empty() ? std::vector<std::string>{this_host()} : d.hosts;
  return plan;
}

// A Kubeflow PyTorchJob pod is one node of a job without a scheduler (detect/pytorchjob.cpp):
// what its variables say fills the options that the command line, IDIST_* and PET_* left unset,
// and the plan is static_plan's, its provenance naming those variables.
LaunchPlan pod_plan(LaunchOptions o, const PodDetected& pod, const env::Lookup& env) {
  std::map<std::string, std::string> from;
  if (!o.nproc_per_node && pod.nproc_per_node) {
    o.nproc_per_node = config::torchrun_nproc_per_node(pod.nproc_per_node->value,
                                                       pod.nproc_per_node->from + "='" + pod.nproc_per_node->value + "'");
    from["local_world_size"] = pod.nproc_per_node->from + "=" + pod.nproc_per_node->value;
  }
  if (!o.rdzv_endpoint && !o.master_addr && pod.rdzv_endpoint) {
    o.rdzv_endpoint = pod.rdzv_endpoint->value;
    from["master_addr"] = pod.rdzv_endpoint->from + " (the pod that hosts the rendezvous runs rank 0)";
  }
  const bool elastic = o.rdzv_endpoint.has_value();
  if (elastic) {
    // An elastic job with a Master replica: v1.7+ also set PET_MASTER_* and PET_NODE_RANK,
    // which reached the options as torchrun's; its c10d rendezvous ignores them, and so do we.
    if (o.master_addr && pod.master_addr && *o.master_addr == pod.master_addr->value) {
      o.master_addr.reset();
      if (o.master_port && pod.master_port && *o.master_port == pod.master_port->value) o.master_port.reset();
    }
    if (o.node_rank && pod.node_rank && *o.node_rank == pod.node_rank->value) o.node_rank.reset();
  }
  if (!o.nnodes && pod.nnodes) {
    o.nnodes = pod.nnodes->value;
    if (pod.min_nodes) o.min_nodes = pod.min_nodes->value;
    from["nnodes"] = pod.min_nodes ? pod.nnodes->from + " MIN:MAX: the pods in the attempt (the rendezvous)"
                                   : pod.nnodes->from;
  }
  if (!elastic && !o.node_rank && pod.node_rank && o.nnodes.value_or(1) > 1) {
    o.node_rank = pod.node_rank->value;
    from["node_rank"] = pod.node_rank->from;
  }
  if (!elastic && !o.master_addr && pod.master_addr && o.nnodes.value_or(1) > 1) {
    o.master_addr = pod.master_addr->value;
    from["master_addr"] = pod.master_addr->from + " (the master pod's service: rank 0 and the rendezvous)";
  }
  if (!elastic && !o.master_port && pod.master_port && o.nnodes.value_or(1) > 1) o.master_port = pod.master_port->value;
  std::vector<std::string> notes = pod.notes;
  if (!o.rdzv_id && pod.rdzv_id) o.rdzv_id = pod.rdzv_id->value;
  const auto token = env(env::kJobToken);
  if (!o.rdzv_id && (!token || token->empty()) && o.nnodes.value_or(1) > 1 && !pod.job_name.empty()) {
    // As a SLURM job's id does (outer_plan): every pod knows the job's name, no other job has it.
    o.rdzv_id = "pytorchjob:" + pod.job_name;
    notes.push_back("IDIST_JOB_TOKEN is not set: the pods admit whoever presents this job's name (derived from " +
                    pod.job_name_from + "), which keeps jobs apart but is no secret; export a secret to every pod "
                    "(IDIST_JOB_TOKEN from a Kubernetes Secret) to require it");
  }
  auto plan = static_plan(o, env);
  plan.detected_by = pod.source;
  for (auto& [key, text] : from) plan.provenance[key] = text;
  if (from.contains("nnodes") && !plan.rendezvous) plan.provenance["world_size"] = from["nnodes"] + " x -n";
  plan.notes.insert(plan.notes.end(), notes.begin(), notes.end());
  return plan;
}

}  // namespace

namespace {

// MPI ranks are made by mpirun, not by fork: processes idist-run spawns would each be a world
// of one. Said here, before anything starts, rather than by every rank at init.
LaunchPlan checked(LaunchPlan plan) {
  if (plan.job.backend == "mpi" && plan.mode == Mode::spawn && plan.job.world_size > 1)
    throw UsageError("--backend mpi needs its ranks started by mpirun, not spawned by idist-run: run `mpirun -np " +
                     std::to_string(plan.job.world_size) + " idist-run --backend mpi ...`, or use --backend gloo");
  return plan;
}

// pytorch/examples' dist-mnist under idist-run -n 2: two worlds of one, each training on all
// the data and exiting 0. What starts MPI's ranks must be an MPI launcher, which idist-run
// (under mpirun, detect/mpi.cpp) then execs in place as one task per rank.
void refuse_mpi_program(const LaunchPlan& plan, const LaunchOptions& o) {
  if (plan.mode != Mode::spawn || plan.job.world_size <= 1 || o.program_path.empty()) return;
  if (!plan.job.backend.empty() && plan.job.backend != "mpi") return;  // the user says it does not use MPI
  const auto library = mpi_library(o.program_path);
  if (library.empty()) return;
  const std::string n = std::to_string(plan.job.world_size);
  const std::string program = o.command.empty() ? o.program_path : o.command.front();
  const std::string rest = o.command.size() > 1 ? " ..." : "";
  const std::string start =
      plan.detected_by.empty()
          ? "start its ranks with mpirun: `mpirun -np " + n + " " + program + rest + "` (or `mpirun -np " + n +
                " idist-run " + program + rest + "`)"
          : "let the outer launcher (" + plan.detected_by + ") start one task per rank, without -n";
  throw UsageError("program '" + program + "' links " + library + " (MPI): ranks idist-run spawns would each be an " +
                   "MPI world of one; " + start + ", or pass --backend gloo if it does not use MPI");
}

LaunchPlan unchecked_plan(const LaunchOptions& o, const env::Lookup& env);

}  // namespace

LaunchPlan make_plan(const LaunchOptions& o, const env::Lookup& env) {
  auto plan = checked(unchecked_plan(o, env));
  refuse_mpi_program(plan, o);
  // Only ranks we spawn: srun and mpirun bind the tasks they start themselves.
  if (plan.mode == Mode::spawn)
    bind_ranks(plan, o.bind, plan.local_count, cpu_view(env));
  else
    plan.binding = "not bound by idist-run: it execs in place, and the outer launcher binds its tasks";
  plan.max_restarts = o.max_restarts;
  plan.keep_slurm_env = o.keep_slurm_env;
  plan.local_rank_arg = o.local_rank_arg;
  plan.program_words = program_words(o.command);
  if (!env(kPythonUnbuffered)) plan.rank_defaults.emplace(kPythonUnbuffered, "1");
  return plan;
}

namespace {

LaunchPlan unchecked_plan(const LaunchOptions& o, const env::Lookup& env) {
  // A PyTorchJob pod is asked for first: its PET_* may already have given --nnodes (config.cpp).
  if (o.launcher == "auto" && !o.no_detect)
    if (auto pod = detect_pytorchjob(env)) return pod_plan(o, *pod, env);
  if (o.nnodes || o.node_rank || o.rdzv_endpoint) {
    if (o.launcher != "auto" && o.launcher != "spawn")
      throw UsageError("--nnodes/--node-rank describe a job without a scheduler; they do not go with --launcher " +
                       o.launcher);
    return static_plan(o, env);
  }
  std::vector<std::string> notes;
  // An explicit --launcher beats IDIST_NO_DETECT from the environment.
  if (o.launcher == "spawn" || (o.no_detect && o.launcher == "auto")) {
    notes.push_back(o.no_detect ? "detection off: IDIST_NO_DETECT=1" : "detection off: --launcher spawn");
  } else {
    auto detection = detect(env, {.launcher = o.launcher,
                                  .job_id_needed = !o.master_port && !o.rdzv_id,
                                  .pmi = o.pmi});
    notes = std::move(detection.notes);
    if (detection.found) {
      auto plan = outer_plan(o, *detection.found, env);
      plan.notes.insert(plan.notes.begin(), notes.begin(), notes.end());
      return plan;
    }
  }
  auto plan = static_plan(o, env);
  plan.notes.insert(plan.notes.begin(), notes.begin(), notes.end());
  return plan;
}

}  // namespace

CpuView cpu_view(const env::Lookup& env) {
  auto allotted = allotted_cpus();
  auto mask = usable_cpus();
  auto claimed = claimed_cpus(mask, cpu_claims_dir(env));
  return {std::move(mask),   std::move(allotted.cpus), std::move(allotted.source), numa_node_of_cpu(),
          core_of_cpu(),     std::move(claimed)};
}

// Unbound ranks of a busy machine are moved about by the scheduler, and two that land on one
// core take turns at every step of a collective: 8-byte all_reduces on 2 ranks took 0.3-0.8 us
// bound and 11-21 us unbound in most runs (docs/BENCHMARKS.md, item 14). Hence binding by
// default, as mpirun does, but only where each rank gets a cpu of its own, and only among the
// cpus nobody chose for us (a mask narrower than the allotment is someone's binding, which we
// keep rather than cut up). The price, measured there too: a bound rank cannot leave a core
// that other work shares, so large calls on a machine busy with other jobs can be slower bound.
// Other idist-run jobs' bound ranks are work we can see (cpu_claims.hpp): their cpus are left
// out, and where the rest are too few our ranks stay unbound and the bound jobs let go.
void bind_ranks(LaunchPlan& plan, Bind bind, int ranks, const CpuView& view) {
  plan.cpu_shares.clear();
  plan.binding_wants_cpus = false;
  const std::size_t n = view.mask.size();
  const std::string here =
      std::to_string(ranks) + " rank(s) on " + std::to_string(n) + " usable cpu(s) (" + cpu_list(view.mask) + ")";
  std::vector<int> free;
  std::set_difference(view.mask.begin(), view.mask.end(), view.claimed.begin(), view.claimed.end(),
                      std::back_inserter(free));
  const std::string others =
      view.claimed.empty() ? "" : "other idist-run jobs here bound ranks to cpu(s) " + cpu_list(view.claimed);
  const bool too_few_free = !view.claimed.empty() && static_cast<std::size_t>(ranks) > free.size();
  if (bind == Bind::never) {
    plan.binding = "not bound: --no-bind (or IDIST_BIND=0, or bind: false in a config file)";
    if (too_few_free) plan.binding += "; " + others + ", which leaves fewer than a cpu per rank: they wait yielding "
                                      "the processor";
    plan.binding_wants_cpus = too_few_free;
    return;
  }
  if (bind == Bind::always) {
    plan.cpu_shares = cpu_shares(view.mask, ranks, view.numa, view.core);
    plan.binding = "bound (--bind): " + here;
    if (static_cast<std::size_t>(ranks) > n) plan.binding += ", so some share a cpu";
    return;
  }
  if (ranks > 0 && static_cast<std::size_t>(ranks) > n) {
    plan.binding = "not bound: " + here + ": binding would put ranks on one cpu for good; the scheduler may "
                   "move them (--bind forces it)";
    return;
  }
  const bool narrowed = !view.allotted.empty() && std::any_of(view.allotted.begin(), view.allotted.end(), [&](int c) {
    return !std::binary_search(view.mask.begin(), view.mask.end(), c);
  });
  if (narrowed) {
    plan.binding = "not bound: idist-run's affinity mask (" + cpu_list(view.mask) + ") is narrower than the " +
                   view.allotted_source + ": the user or an outer launcher bound it, and its ranks stay within it "
                   "(--bind shares it out)";
    return;
  }
  if (too_few_free) {
    plan.binding = "not bound: " + here + ", and " + others + ", which leaves fewer than a cpu per rank; the "
                   "scheduler may move them (--bind forces it), and they wait yielding the processor";
    plan.binding_wants_cpus = true;
    return;
  }
  plan.cpu_shares = cpu_shares(free, ranks, view.numa, view.core);
  plan.binding = "bound (the default where every rank gets a cpu; --no-bind to opt out): " + here;
  if (!others.empty()) plan.binding += ", leaving out those " + others;
}

namespace {
void unbind_for_others(LaunchPlan& plan) {
  plan.cpu_shares.clear();
  plan.binding = "not bound: another idist-run job here runs unbound for want of free cpus";
}
}  // namespace

void follow_binding(LaunchPlan& plan, HeldBinding& held) {
  if (held.let_go_if_shared() && !plan.cpu_shares.empty()) unbind_for_others(plan);
}

std::unique_ptr<HeldBinding> hold_binding(LaunchPlan& plan, Bind bind, const env::Lookup& env) {
  using Role = HeldBinding::Role;
  CpuClaims claims;
  const auto dir = cpu_claims_dir(env);
  auto chosen = [&] {
    std::vector<int> cpus;
    for (const auto& share : plan.cpu_shares) cpus.insert(cpus.end(), share.begin(), share.end());
    std::sort(cpus.begin(), cpus.end());
    cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
    return cpus;
  };
  const auto mask = usable_cpus();
  if (plan.mode != Mode::spawn) return std::make_unique<HeldBinding>(Role::unbound, std::move(claims), mask, dir);
  if (bind == Bind::never)
    return std::make_unique<HeldBinding>(plan.binding_wants_cpus ? Role::unbound_for_want : Role::unbound,
                                         std::move(claims), mask, dir);
  if (bind == Bind::always) {
    const auto cpus = chosen();
    // Asked before claiming: a look meets our own claims too.
    const bool over_claims = !claimed_cpus(cpus, dir).empty();
    claims.claim_free(cpus, dir);
    return std::make_unique<HeldBinding>(over_claims ? Role::bound_over_claims : Role::bound_by_request,
                                         std::move(claims), mask, dir);
  }
  // A job already runs unbound for want of cpus: binding now would only be let go at once.
  if (!plan.cpu_shares.empty() && others_run_unbound(dir)) unbind_for_others(plan);
  // Jobs started at the same moment may each see the others' cpus free; whoever claims second
  // looks again. A few rounds, then unbound rather than waiting on the others.
  for (int round = 1; !plan.cpu_shares.empty(); ++round) {
    if (claims.claim_all(chosen(), dir))
      return std::make_unique<HeldBinding>(Role::bound_by_default, std::move(claims), mask, dir);
    if (round == 3) {
      plan.cpu_shares.clear();
      plan.binding = "not bound: other idist-run jobs starting here at the same time kept claiming the cpus it chose";
      break;
    }
    bind_ranks(plan, bind, plan.local_count, cpu_view(env));
  }
  return std::make_unique<HeldBinding>(plan.binding_wants_cpus ? Role::unbound_for_want : Role::unbound,
                                       std::move(claims), mask, dir);
}

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
  for (auto name : {env::kJobToken, env::kRunId, env::kLauncher}) vars.erase(std::string(name));
  // Nor an outer job's descriptors into ranks we spawn: they get ours (their flight recorder,
  // the cpus-shared notice). A rank we exec in place is the outer job's, and keeps them.
  if (plan.mode == Mode::spawn)
    for (auto name : {env::kRecorderFd, env::kCpusSharedFd}) vars.erase(std::string(name));
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

void apply_assignment(LaunchPlan& plan, int attempt, int node_rank, int nnodes, int world_size, int rank_base,
                      int master_port) {
  auto& job = plan.job;
  job.job_token = plan.rendezvous->token + "#" + std::to_string(attempt);
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
