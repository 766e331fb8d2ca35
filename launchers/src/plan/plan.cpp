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
#include "plan_limits.hpp"

namespace idist::launchers {
namespace {

std::string this_host() { return common::host_name("localhost"); }

constexpr const char* kPythonUnbuffered = "PYTHONUNBUFFERED";


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

// The command line of one node without a scheduler, checked before anything is planned.
void check_static_options(const LaunchOptions& o, int nnodes, int min_nodes, int node_rank, int k) {
  if (o.node_rank && !o.nnodes) throw UsageError("--node-rank needs --nnodes (the number of nodes in the job)");
  if (o.rdzv_endpoint && !o.nnodes) throw UsageError("--rdzv-endpoint needs --nnodes (N, or MIN:MAX)");
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
}

// Where the nodes meet: --rdzv-endpoint HOST[:PORT], else --master-addr and its port.
RendezvousPlan rendezvous_plan(const LaunchOptions& o, int nnodes, int min_nodes) {
  RendezvousPlan r;
  r.min_nodes = min_nodes;
  r.max_nodes = nnodes;
  r.node_rank = o.node_rank;
  if (!o.rdzv_endpoint) {
    r.host = *o.master_addr;
    r.port = o.master_port.value_or(kDefaultMasterPort);
    return r;
  }
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
  return r;
}

// Rank 0's port on one node without a scheduler, and where it came from.
void static_master_port(const LaunchOptions& o, int nnodes, bool several, LaunchPlan& plan) {
  auto& job = plan.job;
  auto& from = plan.provenance;
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
}

// A job over several nodes without a scheduler: its identity, and where every rank's place
// comes from (the rendezvous).
void static_nodes_identity(const LaunchOptions& o, const env::Lookup& env, int nnodes, int min_nodes,
                           LaunchPlan& plan) {
  auto& job = plan.job;
  auto& from = plan.provenance;
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
      o.rdzv_id ? rdzv_run_id(*o.rdzv_id) : "static-" + job.master_addr + "-" + std::to_string(plan.rendezvous->port));
  plan.rendezvous->token = job.job_token;
}

// One node of a job without a scheduler: plain `-n K` (N = 1) or torchrun's static rendezvous.
LaunchPlan static_plan(const LaunchOptions& o, const env::Lookup& env) {
  const int nnodes = o.nnodes.value_or(1);
  const int min_nodes = o.min_nodes.value_or(nnodes);
  const bool several = nnodes > 1 || o.rdzv_endpoint;
  const int node_rank = o.node_rank.value_or(0);
  const int k = o.nproc_per_node.value_or(1);
  check_static_options(o, nnodes, min_nodes, node_rank, k);

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
    plan.rendezvous = rendezvous_plan(o, nnodes, min_nodes);
    job.master_addr = plan.rendezvous->host;
  }
  const std::string k_from = o.nproc_per_node ? "--nproc-per-node" : "default (1 process)";
  auto& from = plan.provenance;
  from["master_addr"] = o.master_addr ? "--master-addr" : "default (127.0.0.1: one node)";
  static_master_port(o, nnodes, several, plan);

  if (!several) {
    from["rank"] = "local index (0 to " + std::to_string(k - 1) + ")";
    from["world_size"] = k_from;
    from["node_rank"] = "default (one node)";
    from["nnodes"] = "default (one node)";
    job.run_id = o.rdzv_id ? rdzv_run_id(*o.rdzv_id) : random_token(6);
    job.job_token = random_token();
  } else {
    static_nodes_identity(o, env, nnodes, min_nodes, plan);
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

// One task per rank: the launcher's rank is ours.
void exec_ranks(const Detected& d, LaunchPlan& plan) {
  auto& job = plan.job;
  auto& from = plan.provenance;
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
}

// -n K under an outer launcher: K ranks for each of its tasks, refused where a node runs
// several tasks (unless --force-spawn).
void spawn_ranks(const LaunchOptions& o, const Detected& d, int k, LaunchPlan& plan) {
  auto& job = plan.job;
  auto& from = plan.provenance;
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
void outer_master_addr(const LaunchOptions& o, const Detected& d, LaunchPlan& plan) {
  auto& job = plan.job;
  auto& from = plan.provenance;
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
}

// Rank 0's port: given, or derived from the job's identity, or free here for a job of one task.
void outer_master_port(const LaunchOptions& o, const Detected& d, const env::Lookup& env, LaunchPlan& plan) {
  auto& job = plan.job;
  auto& from = plan.provenance;
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
}

// Every rank must agree on these without talking first, so they come from the job's identity.
void outer_identity(const LaunchOptions& o, const Detected& d, const env::Lookup& env, LaunchPlan& plan) {
  auto& job = plan.job;
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
}

// Inside an outer launcher: become its task (exec) or spawn -n ranks as its node.
LaunchPlan outer_plan(const LaunchOptions& o, const Detected& d, const env::Lookup& env) {
  LaunchPlan plan;
  plan.detected_by = d.source;
  plan.command = o.command;
  auto& job = plan.job;
  job.launcher = d.launcher;
  job.backend = o.backend;
  job.nnodes = d.nnodes.value;
  job.node_rank = d.node_rank.value;
  plan.provenance["nnodes"] = d.nnodes.from;
  plan.provenance["node_rank"] = d.node_rank.from;

  const int k = o.nproc_per_node.value_or(1);
  if (k == 1)
    exec_ranks(d, plan);
  else
    spawn_ranks(o, d, k, plan);
  outer_master_addr(o, d, plan);
  outer_master_port(o, d, env, plan);
  outer_identity(o, d, env, plan);
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

}  // namespace idist::launchers
