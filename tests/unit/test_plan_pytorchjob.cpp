// Launch plans (test_plan, continued): Kubeflow PyTorchJob pods, one node of a job over several.
#include <doctest/doctest.h>

#include <algorithm>

#include "idist/launchers/plan.hpp"
#include "launcher_envs.hpp"
#include "plan_helpers.hpp"

using namespace idist;
using namespace idist::launchers;
using namespace test;

// ---- Kubeflow PyTorchJob pods: one node of a job over several, as --nnodes would make it ----

TEST_CASE("a PyTorchJob worker pod (v1.7+) is node 1 of 2, meeting at the master's service") {
  const auto plan = make_plan(options(), from(kPyTorchJobWorkerV17));
  CHECK(contains(plan.detected_by, "Kubeflow PyTorchJob pod"));
  CHECK(plan.mode == Mode::spawn);
  CHECK(plan.local_count == 2);
  REQUIRE(plan.rendezvous);
  CHECK(plan.rendezvous->host == "mnist-master-0");
  CHECK(plan.rendezvous->port == 23456);
  CHECK(plan.rendezvous->node_rank == 1);
  CHECK(plan.rendezvous->min_nodes == 2);
  CHECK(plan.rendezvous->max_nodes == 2);
  CHECK(plan.provenance.at("node_rank") == "PET_NODE_RANK");
  CHECK(plan.provenance.at("local_world_size") == "PET_NPROC_PER_NODE=2");
  // No secret in the pod: the job's name keeps jobs apart, and a note says it is no secret.
  CHECK(plan.rendezvous->token == "pytorchjob:mnist-master-0:23456");
  CHECK(std::any_of(plan.notes.begin(), plan.notes.end(), [](auto& n) { return contains(n, "no secret"); }));
}

TEST_CASE("the older operator's pod gives the same plan, from WORLD_SIZE and RANK counting pods") {
  const auto plan = make_plan(options(), from(kPyTorchJobWorkerV15));
  REQUIRE(plan.rendezvous);
  CHECK(plan.local_count == 2);
  CHECK(plan.rendezvous->node_rank == 1);
  CHECK(plan.rendezvous->max_nodes == 2);
  CHECK(contains(plan.provenance.at("nnodes"), "WORLD_SIZE (pods"));
  // The command line wins over what the pod says; IDIST_JOB_TOKEN over the derived name.
  auto o = options(3);
  const auto own = make_plan(o, from(with(kPyTorchJobWorkerV15, {{"IDIST_JOB_TOKEN", "s3cret"}})));
  CHECK(own.local_count == 3);
  CHECK(own.rendezvous->token == "s3cret");
}

TEST_CASE("an elastic PyTorchJob pod: MIN:MAX nodes at PET_RDZV_ENDPOINT, its id the job's secret") {
  const auto plan = make_plan(options(), from(kPyTorchJobElastic));
  REQUIRE(plan.rendezvous);
  CHECK(plan.rendezvous->host == "mnist-worker-0");
  CHECK(plan.rendezvous->port == 23456);
  CHECK(plan.rendezvous->min_nodes == 1);
  CHECK(plan.rendezvous->max_nodes == 3);
  CHECK_FALSE(plan.rendezvous->node_rank);
  CHECK(plan.rendezvous->token == "mnist-run");
}

TEST_CASE("an elastic PyTorchJob with a Master (v1.7+): PET_MASTER_* and PET_NODE_RANK set aside, as torchrun's c10d") {
  const Env env = with(kPyTorchJobElastic, {{"MASTER_ADDR", "mnist-master-0"}, {"PET_MASTER_ADDR", "mnist-master-0"},
                                            {"MASTER_PORT", "23456"}, {"PET_MASTER_PORT", "23456"}, {"RANK", "0"},
                                            {"PET_NODE_RANK", "0"}, {"WORLD_SIZE", "2"}});
  // As the command line's PET_* layer hands them on (config.cpp).
  auto o = options();
  o.master_addr = "mnist-master-0";
  o.master_port = 23456;
  o.node_rank = 0;
  o.rdzv_endpoint = "mnist-worker-0:23456";
  o.nnodes = 3;
  o.min_nodes = 1;
  const auto plan = make_plan(o, from(env));
  REQUIRE(plan.rendezvous);
  CHECK(plan.rendezvous->host == "mnist-worker-0");
  CHECK_FALSE(plan.rendezvous->node_rank);
  CHECK(std::any_of(plan.notes.begin(), plan.notes.end(),
                    [](auto& n) { return contains(n, "PET_NODE_RANK and PET_MASTER_ADDR ignored"); }));
}

TEST_CASE("a bare RANK/WORLD_SIZE with -n: the refusal names the PyTorchJob form too") {
  const Env pod = without(kPyTorchJobWorkerV15, {"PET_NPROC_PER_NODE"});
  const auto error = usage_error(options(2), pod);
  CHECK(contains(error, "srun --ntasks-per-node=1"));
  CHECK(contains(error, "in a Kubeflow PyTorchJob pod (RANK and WORLD_SIZE count pods) set nprocPerNode"));
}

TEST_CASE("every rank gets torchrun's TORCHELASTIC_*, ROLE_* and GROUP_* beside the contract") {
  auto o = options(2);
  o.max_restarts = 3;
  auto plan = make_plan(o, from({}));
  char stale[] = "TORCHELASTIC_RESTART_COUNT=9";
  char* base[] = {stale, nullptr};
  const auto attempt = attempt_of(plan, "/bin/true", 1, base);
  const auto& vars = attempt.processes.at(1).env;
  const auto has = [&](const std::string& entry) { return std::find(vars.begin(), vars.end(), entry) != vars.end(); };
  CHECK(has("TORCHELASTIC_RESTART_COUNT=1"));
  CHECK(has("TORCHELASTIC_MAX_RESTARTS=3"));
  CHECK(has("TORCHELASTIC_RUN_ID=" + plan.job.run_id));
  CHECK(has("ROLE_NAME=default"));
  CHECK(has("ROLE_RANK=1"));
  CHECK(has("ROLE_WORLD_SIZE=2"));
  CHECK(has("GROUP_RANK=0"));
  CHECK(has("GROUP_WORLD_SIZE=1"));
}
