// Launcher detection (test_detect, continued): Kubeflow PyTorchJob pods.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "idist/launchers/detect.hpp"
#include "launcher_envs.hpp"

using namespace idist::launchers;
using namespace test;

// ---- Kubeflow PyTorchJob pods (detect/pytorchjob.cpp): a pod is a node, not a rank ----

namespace {

bool any_note_of(const std::vector<std::string>& notes, std::string_view part) {
  for (const auto& note : notes)
    if (contains(note, part)) return true;
  return false;
}

PodDetected pod_of(const Env& vars) {
  auto d = detect(from(vars), {.pmi = fake_pmi});
  REQUIRE(d.pod);
  CHECK_FALSE(d.found);
  return *d.pod;
}

std::string pod_error(const Env& vars) {
  try {
    detect_pytorchjob(from(vars));
  } catch (const std::exception& e) {  // DetectError, or config's UsageError for PET_RDZV_BACKEND
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("PyTorchJob v1.7+: WORLD_SIZE counts processes, PET_NNODES the pods, PET_NODE_RANK the pod") {
  const auto pod = pod_of(kPyTorchJobWorkerV17);
  CHECK(contains(pod.source, "v1.7 or later"));
  CHECK(pod.nnodes->value == 2);
  CHECK(pod.nnodes->from == "PET_NNODES");
  CHECK(pod.node_rank->value == 1);
  CHECK(pod.node_rank->from == "PET_NODE_RANK");
  CHECK(pod.nproc_per_node->value == "2");
  CHECK(pod.master_addr->value == "mnist-master-0");
  CHECK(pod.master_port->value == 23456);
  CHECK(pod.job_name == "mnist-master-0:23456");
  CHECK_FALSE(pod.min_nodes);
}

TEST_CASE("PyTorchJob v1.7+ with nprocPerNode auto or 1: WORLD_SIZE is the pods either way") {
  CHECK(pod_of(with(kPyTorchJobWorkerV17, {{"PET_NPROC_PER_NODE", "auto"}, {"WORLD_SIZE", "2"}})).nnodes->value == 2);
  CHECK(pod_of(with(kPyTorchJobWorkerV17, {{"PET_NPROC_PER_NODE", "gpu"}, {"WORLD_SIZE", "2"}})).nproc_per_node->value ==
        "gpu");
  // Neither convention: said, with both readings.
  CHECK(pod_error(with(kPyTorchJobWorkerV17, {{"WORLD_SIZE", "6"}})) ==
        "Kubeflow PyTorchJob pod: WORLD_SIZE=6 is neither PET_NNODES=2 pods nor PET_NNODES x PET_NPROC_PER_NODE = 4 "
        "processes");
}

TEST_CASE("PyTorchJob before v1.7: WORLD_SIZE counts pods and RANK is the pod, and the provenance says so") {
  const auto pod = pod_of(kPyTorchJobWorkerV15);
  CHECK(contains(pod.source, "before v1.7"));
  CHECK(pod.nnodes->value == 2);
  CHECK(contains(pod.nnodes->from, "WORLD_SIZE (pods: no PET_NODE_RANK"));
  CHECK(pod.node_rank->value == 1);
  CHECK(pod.master_addr->from == "MASTER_ADDR");
}

TEST_CASE("elastic PyTorchJob: MIN:MAX pods meeting at PET_RDZV_ENDPOINT, ranked by the rendezvous") {
  const auto pod = pod_of(kPyTorchJobElastic);
  CHECK(contains(pod.source, "elastic"));
  CHECK(pod.min_nodes->value == 1);
  CHECK(pod.nnodes->value == 3);
  CHECK(pod.rdzv_endpoint->value == "mnist-worker-0:23456");
  CHECK(pod.rdzv_id->value == "mnist-run");
  CHECK(pod.rdzv_backend == "c10d");
  CHECK_FALSE(pod.node_rank);
  auto d = detect(from(kPyTorchJobElastic));
  CHECK(any_note_of(d.pod->notes, "PET_MONITOR_INTERVAL=5 ignored"));
}

TEST_CASE("a rank torchrun started in a pod inherits PET_*, but is a rank: the torchrun-style reading") {
  auto vars = with(kPyTorchJobWorkerV17, {{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"RANK", "3"}});
  const auto d = detect(from(vars));
  CHECK_FALSE(d.pod);
  REQUIRE(d.found);
  CHECK(d.found->launcher == "env");
  CHECK(d.found->rank.value == 3);
}

TEST_CASE("a forced --launcher does not read a pod") {
  const auto d = detect(from(kPyTorchJobWorkerV17), {.launcher = "env"});
  CHECK_FALSE(d.pod);
  REQUIRE(d.found);
  CHECK(d.found->rank.value == 1);
}

TEST_CASE("bad PyTorchJob variables: one line each, naming them") {
  CHECK(pod_error(with(kPyTorchJobElastic, {{"PET_NNODES", "3:2"}})) ==
        "Kubeflow PyTorchJob pod: PET_NNODES='3:2': MIN is above MAX");
  CHECK(pod_error(with(kPyTorchJobWorkerV15, {{"RANK", "2"}})) ==
        "Kubeflow PyTorchJob pod: RANK=2 is not below WORLD_SIZE=2 (pods)");
  CHECK(pod_error(with(kPyTorchJobWorkerV17, {{"RANK", "2"}, {"PET_NODE_RANK", "2"}})) ==
        "Kubeflow PyTorchJob pod: PET_NODE_RANK=2 is not below PET_NNODES=2");
  CHECK(pod_error(with(kPyTorchJobWorkerV17, {{"PET_NPROC_PER_NODE", "abc"}})) ==
        "Kubeflow PyTorchJob pod: PET_NPROC_PER_NODE='abc' is not a number of processes (1 to 4096), auto, gpu or cpu");
  CHECK(pod_error(with(kPyTorchJobWorkerV17, {{"PET_NODE_RANK", "0"}})) ==
        "Kubeflow PyTorchJob pod: PET_NODE_RANK=0 and RANK=1 disagree (the operator sets both to the pod's index)");
  CHECK(pod_error(with(kPyTorchJobWorkerV17, {{"PET_MASTER_ADDR", "other"}})) ==
        "Kubeflow PyTorchJob pod: PET_MASTER_ADDR='other' and MASTER_ADDR='mnist-master-0' disagree");
  CHECK(pod_error(without(kPyTorchJobWorkerV15, {"MASTER_ADDR"})) ==
        "Kubeflow PyTorchJob pod: 2 pods but no MASTER_ADDR: where is the master pod?");
  CHECK(pod_error(with(kPyTorchJobWorkerV15, {{"PET_NNODES", "1:2"}})) ==
        "Kubeflow PyTorchJob pod: PET_NNODES='1:2' without PET_RDZV_ENDPOINT: MIN:MAX needs an elastic policy");
  CHECK(contains(pod_error(with(kPyTorchJobElastic, {{"PET_RDZV_BACKEND", "zk"}})),
                 "PET_RDZV_BACKEND='zk' is not a rendezvous backend idist-run knows"));
  CHECK(pod_error(without(kPyTorchJobElastic, {"PET_RDZV_ENDPOINT"})) ==
        "Kubeflow PyTorchJob pod: PET_RDZV_BACKEND is set but PET_RDZV_ENDPOINT is not: where do the pods meet?");
  // What is set and what is missing, as they are: PET_NNODES alone is neither RANK nor WORLD_SIZE.
  CHECK(pod_error({{"PET_NNODES", "2"}}) == "Kubeflow PyTorchJob pod: PET_NNODES is set but RANK and WORLD_SIZE are not: "
                                           "the operator sets RANK and WORLD_SIZE in every pod of a job with a Master");
  CHECK(contains(pod_error({{"PET_NNODES", "2"}, {"RANK", "0"}}), "PET_NNODES and RANK are set but WORLD_SIZE is not"));
  // Empty is refused, naming it, as the command line refuses --rdzv-id '' (config::empty_value).
  CHECK(pod_error(with(kPyTorchJobElastic, {{"PET_RDZV_ID", ""}})) == "PET_RDZV_ID is set but empty: unset it or give the job's id");
  CHECK(pod_error(with(kPyTorchJobElastic, {{"PET_RDZV_ENDPOINT", ""}})) ==
        "PET_RDZV_ENDPOINT is set but empty: unset it or give HOST[:PORT]");
  CHECK(contains(pod_error(with(kPyTorchJobWorkerV17, {{"MASTER_ADDR", ""}})), "MASTER_ADDR is set but empty"));
}
