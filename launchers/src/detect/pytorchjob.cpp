// A pod of a Kubeflow PyTorchJob, read from the variables the training operator puts in it
// (kubeflow/training-operator, pkg/controller.v1/pytorch/envvar.go, master.go, elastic.go):
//
//   every generation, with a Master replica: MASTER_ADDR=<job>-master-0, MASTER_PORT (the
//     master's "pytorchjob-port"), RANK = the pod's index (master 0, worker i: i + 1), WORLD_SIZE;
//   before v1.7: WORLD_SIZE counts pods;
//   v1.7 and later: PET_MASTER_ADDR, PET_MASTER_PORT, PET_NODE_RANK (= RANK), PET_NNODES (the
//     pods), PET_NPROC_PER_NODE (nprocPerNode, when set) and WORLD_SIZE = pods x nprocPerNode
//     (nprocPerNode taken as 1 when it is not a number: auto, gpu, cpu);
//   with an elasticPolicy (both): PET_RDZV_ENDPOINT (<job>-worker-0:port by default),
//     PET_RDZV_BACKEND (c10d by default), PET_NNODES (MIN:MAX, or the workers), PET_MAX_RESTARTS,
//     PET_NPROC_PER_NODE, PET_RDZV_ID, PET_RDZV_CONF, PET_STANDALONE.
//
// Such a pod is not a rank but a node: torchrun there starts PET_NPROC_PER_NODE workers and
// meets the other pods at MASTER_ADDR:MASTER_PORT (static) or at PET_RDZV_ENDPOINT (elastic).
// So is idist-run: what is read here becomes the options of a job over several nodes
// (plan.cpp, pod_plan). The generation is told by PET_NODE_RANK, which only v1.7 and later
// set, and WORLD_SIZE is checked against the convention it implies, never guessed.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>
#include <vector>

#include "detectors.hpp"
#include "idist/launchers/config.hpp"
#include "parse_whole.hpp"

namespace idist::launchers {
namespace {

constexpr std::string_view kSource = "Kubeflow PyTorchJob pod";

// The operator's variables; any one of them (without LOCAL_RANK) says this is a pod.
constexpr std::string_view kPetNprocPerNode = "PET_NPROC_PER_NODE";
constexpr std::string_view kPetNnodes = "PET_NNODES";
constexpr std::string_view kPetNodeRank = "PET_NODE_RANK";
constexpr std::string_view kPetMasterAddr = "PET_MASTER_ADDR";
constexpr std::string_view kPetMasterPort = "PET_MASTER_PORT";
constexpr std::string_view kPetRdzvEndpoint = "PET_RDZV_ENDPOINT";
constexpr std::string_view kPetRdzvBackend = "PET_RDZV_BACKEND";
constexpr std::string_view kPetRdzvId = "PET_RDZV_ID";
constexpr std::string_view kPetMaxRestarts = "PET_MAX_RESTARTS";
// Each with what it wants, for the one rule on empty values (config::empty_value).
constexpr std::pair<std::string_view, std::string_view> kPetMarks[] = {
    {kPetNprocPerNode, "a number of processes, auto, gpu or cpu"},
    {kPetNnodes, "a number of pods or MIN:MAX"},
    {kPetNodeRank, "the pod's index"},
    {kPetMasterAddr, "the master pod's address"},
    {kPetMasterPort, "a port"},
    {kPetRdzvEndpoint, "HOST[:PORT]"},
    {kPetRdzvBackend, "a backend (c10d, static, etcd or etcd-v2)"},
    {kPetRdzvId, "the job's id"},
    {kPetMaxRestarts, "a number of restarts"}};

[[noreturn]] void fail(const std::string& what) { throw DetectError(std::string(kSource) + ": " + what); }

std::optional<Sourced<int>> whole(const env::Lookup& env, std::string_view name, int min, std::string_view what) {
  const auto text = env(name);
  if (!text) return std::nullopt;
  const auto value = parse_whole<int>(*text);
  if (!value || *value < min) fail(fmt::format("{}='{}' is not {}", name, *text, what));
  return Sourced<int>{*value, std::string(name)};
}

// torchrun's --nnodes: N, or MIN:MAX.
std::pair<Sourced<int>, Sourced<int>> node_range(std::string_view name, const std::string& text) {
  const auto colon = text.find(':');
  const auto count = [&](std::string_view part) {
    const auto n = parse_whole<int>(part);
    if (!n || *n < 1) fail(fmt::format("{}='{}' is not a number of pods or MIN:MAX", name, text));
    return *n;
  };
  const int min = count(std::string_view(text).substr(0, colon));
  const int max = colon == std::string::npos ? min : count(std::string_view(text).substr(colon + 1));
  if (min > max) fail(fmt::format("{}='{}': MIN is above MAX", name, text));
  return {Sourced<int>{min, std::string(name)}, Sourced<int>{max, std::string(name)}};
}

// torchrun's PET_MASTER_ADDR beside MASTER_ADDR (and the ports alike): the operator sets both
// to one value; a pod spec that sets one of them by hand must not contradict the other.
std::optional<Sourced<std::string>> one_of(const env::Lookup& env, std::string_view pet, std::string_view plain,
                                           std::string_view what) {
  const auto a = env(pet);
  const auto b = env(plain);
  if (b) config::refuse_empty(plain, *b, what);
  if (a && b && *a != *b) fail(fmt::format("{}='{}' and {}='{}' disagree", pet, *a, plain, *b));
  if (a) return Sourced<std::string>{*a, std::string(pet)};
  if (b) return Sourced<std::string>{*b, std::string(plain)};
  return std::nullopt;
}

using Whole = std::optional<Sourced<int>>;
using Range = std::pair<Sourced<int>, Sourced<int>>;

// Some of the variables of a job with a Master replica, but not RANK and WORLD_SIZE both.
[[noreturn]] void refuse_incomplete(const Whole& rank, const Whole& world, const Whole& node_rank, bool range) {
  // Named as they are: PET_NNODES alone is neither RANK nor WORLD_SIZE.
  std::vector<std::string_view> given, missing;
  for (auto [name, set] : {std::pair{kPetNodeRank, node_rank.has_value()}, std::pair{kPetNnodes, range}})
    if (set) given.push_back(name);
  for (auto [name, set] : {std::pair{env::kRank, rank.has_value()}, std::pair{env::kWorldSize, world.has_value()}})
    (set ? given : missing).push_back(name);
  const auto are = [](const auto& names) { return names.size() == 1 ? "is" : "are"; };
  fail(fmt::format("{} {} set but {} {} not: the operator sets {} and {} in every pod of a job with a Master",
                   fmt::join(given, " and "), are(given), fmt::join(missing, " and "), are(missing), env::kRank,
                   env::kWorldSize));
}

// A pod of a job with a Master replica (RANK and WORLD_SIZE set): which pod, of how many, by
// the convention of the operator's generation (`v17`: PET_NODE_RANK and PET_NNODES beside them).
PodDetected master_pod(PodDetected pod, bool v17, const Sourced<int>& rank, const Sourced<int>& world,
                       const Whole& node_rank, const std::optional<Range>& range, int per_pod) {
  if (v17) {
    if (!node_rank) fail(fmt::format("{} is set but {} is not", kPetMasterAddr, kPetNodeRank));
    if (node_rank->value != rank.value)
      fail(fmt::format("{}={} and {}={} disagree (the operator sets both to the pod's index)", kPetNodeRank,
                       node_rank->value, env::kRank, rank.value));
    if (!range) fail(fmt::format("{} is set but {} is not (the number of pods)", kPetNodeRank, kPetNnodes));
    const int pods = range->second.value;
    // v1.7+ multiply by nprocPerNode; the same pods with WORLD_SIZE counting them is the older
    // convention (or nprocPerNode 1), which the values tell apart unless nprocPerNode is 1.
    if (static_cast<long long>(pods) * per_pod == world.value) {
      pod.nnodes = Sourced<int>{pods, std::string(kPetNnodes)};
      if (per_pod > 1)
        pod.notes.push_back(fmt::format("{}={} counts processes ({} x {}), as the operator since v1.7 sets it",
                                        env::kWorldSize, world.value, kPetNnodes, kPetNprocPerNode));
    } else if (pods == world.value) {
      pod.nnodes = Sourced<int>{pods, std::string(kPetNnodes)};
      pod.notes.push_back(fmt::format("{}={} counts pods ({}), as the operator before v1.7 set it", env::kWorldSize,
                                      world.value, kPetNnodes));
    } else {
      fail(fmt::format("{}={} is neither {}={} pods nor {} x {} = {} processes", env::kWorldSize, world.value,
                       kPetNnodes, pods, kPetNnodes, kPetNprocPerNode, static_cast<long long>(pods) * per_pod));
    }
    pod.node_rank = *node_rank;
  } else {
    // Before v1.7 the operator said nothing else: WORLD_SIZE is the number of pods and RANK
    // the pod's index, whatever PET_NPROC_PER_NODE says.
    pod.nnodes = Sourced<int>{world.value, std::string(env::kWorldSize) + " (pods: no PET_NODE_RANK, the operator before v1.7)"};
    pod.node_rank = Sourced<int>{rank.value, std::string(env::kRank) + " (the pod's index)"};
    if (range && range->second.value != world.value)
      fail(fmt::format("{}={} and {}={} disagree (both count the pods before v1.7)", kPetNnodes, range->second.value,
                       env::kWorldSize, world.value));
  }
  if (pod.node_rank->value >= pod.nnodes->value)
    fail(v17 ? fmt::format("{}={} is not below {}={}", kPetNodeRank, pod.node_rank->value, kPetNnodes, pod.nnodes->value)
             : fmt::format("{}={} is not below {}={} (pods)", env::kRank, pod.node_rank->value, env::kWorldSize,
                           pod.nnodes->value));
  if (pod.nnodes->value > 1 && !pod.master_addr)
    fail(fmt::format("{} pods but no {}: where is the master pod?", pod.nnodes->value, env::kMasterAddr));
  if (pod.master_addr) {
    pod.job_name = pod.master_addr->value + (pod.master_port ? ":" + std::to_string(pod.master_port->value) : "");
    pod.job_name_from = pod.master_addr->from + (pod.master_port ? " and " + pod.master_port->from : "");
  }
  return pod;
}

}  // namespace

std::optional<PodDetected> detect_pytorchjob(const env::Lookup& env) {
  bool marked = false;
  for (auto [name, wants] : kPetMarks) marked = marked || env(name).has_value();
  // torchrun's workers (and ours) inherit the pod's PET_* with a LOCAL_RANK of their own: they
  // are ranks, which the torchrun-style detector reads; only the pod's own process is a node.
  if (!marked || env(env::kLocalRank)) return std::nullopt;
  for (auto [name, wants] : kPetMarks)
    if (const auto value = env(name)) config::refuse_empty(name, *value, wants);

  PodDetected pod;
  const bool elastic = env(kPetRdzvEndpoint) || env(kPetRdzvBackend);
  const auto node_rank = whole(env, kPetNodeRank, 0, "a pod index (a non-negative integer)");
  const bool v17 = node_rank || env(kPetMasterAddr) || env(kPetMasterPort);
  pod.source = fmt::format("{} ({}{})", kSource, v17 ? "training-operator v1.7 or later" : "training-operator before v1.7",
                           elastic ? ", elastic" : "");

  int per_pod = 1;  // what the operator multiplied WORLD_SIZE by
  if (const auto text = env(kPetNprocPerNode)) {
    const auto n = parse_whole<int>(*text);
    if (n && *n >= 1 && *n <= 4096)
      per_pod = *n;
    else if (*text != "auto" && *text != "gpu" && *text != "cpu")
      fail(fmt::format("{}='{}' is not a number of processes (1 to 4096), auto, gpu or cpu", kPetNprocPerNode, *text));
    pod.nproc_per_node = Sourced<std::string>{*text, std::string(kPetNprocPerNode)};
  }

  std::optional<std::pair<Sourced<int>, Sourced<int>>> range;
  if (const auto text = env(kPetNnodes)) range = node_range(kPetNnodes, *text);

  if (const auto backend = env(kPetRdzvBackend)) pod.rdzv_backend = config::torchrun_rdzv_backend(kPetRdzvBackend, *backend);
  if (const auto id = env(kPetRdzvId)) pod.rdzv_id = Sourced<std::string>{*id, std::string(kPetRdzvId)};
  if (const auto endpoint = env(kPetRdzvEndpoint))
    pod.rdzv_endpoint = Sourced<std::string>{*endpoint, std::string(kPetRdzvEndpoint)};
  pod.master_addr = one_of(env, kPetMasterAddr, env::kMasterAddr, "the master pod's address");
  if (const auto port = one_of(env, kPetMasterPort, env::kMasterPort, "a port")) {
    const auto n = parse_whole<int>(port->value);
    if (!n || *n < 1 || *n > 65535) fail(fmt::format("{}='{}' is not a port (1 to 65535)", port->from, port->value));
    pod.master_port = Sourced<int>{*n, port->from};
  }
  for (std::string_view ignored : {"PET_MONITOR_INTERVAL", "PET_START_METHOD"})
    if (const auto v = env(ignored))
      pod.notes.push_back(fmt::format("{}={} ignored: idist-run learns of a rank's end at once (SIGCHLD) and execs its "
                                      "ranks, it neither polls nor forks them",
                                      ignored, *v));

  const auto rank = whole(env, env::kRank, 0, "a pod index (a non-negative integer)");
  const auto world = whole(env, env::kWorldSize, 1, "a positive integer");

  if (elastic) {
    // torchrun's c10d rendezvous ranks the pods itself and ignores RANK, WORLD_SIZE and
    // PET_NODE_RANK (which v1.7+ also gives a Master replica): so does ours.
    if (!pod.rdzv_endpoint) fail(fmt::format("{} is set but {} is not: where do the pods meet?", kPetRdzvBackend, kPetRdzvEndpoint));
    if (!range) fail(fmt::format("{} is set but {} is not (MIN:MAX pods)", kPetRdzvEndpoint, kPetNnodes));
    pod.nnodes = range->second;
    if (range->first.value < range->second.value) pod.min_nodes = range->first;
    // With a Master replica, v1.7+ also give PET_NODE_RANK and PET_MASTER_*: kept in `pod` for
    // pod_plan to set aside where they reached the options (torchrun's c10d ignores them).
    pod.node_rank = node_rank;
    if (rank || node_rank || pod.master_addr)
      pod.notes.push_back(fmt::format("{}{} ignored: an elastic PyTorchJob's pods are ranked by the rendezvous at {}",
                                      node_rank ? kPetNodeRank : env::kRank,
                                      pod.master_addr ? " and " + pod.master_addr->from : std::string(),
                                      pod.rdzv_endpoint->value));
    pod.job_name = pod.rdzv_endpoint->value;
    pod.job_name_from = std::string(kPetRdzvEndpoint);
    return pod;
  }

  if (!rank && !world && !node_rank && !range) return pod;  // one pod: PET_NPROC_PER_NODE alone
  if (!rank || !world) refuse_incomplete(rank, world, node_rank, range.has_value());
  if (range && range->first.value != range->second.value)
    fail(fmt::format("{}='{}:{}' without {}: MIN:MAX needs an elastic policy", kPetNnodes, range->first.value,
                     range->second.value, kPetRdzvEndpoint));

  return master_pod(std::move(pod), v17, *rank, *world, node_rank, range, per_pod);
}

}  // namespace idist::launchers
