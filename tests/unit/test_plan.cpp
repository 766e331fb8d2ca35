// Launch plans: plain and static multi-node spawn, exec in place under an outer launcher,
// per-node spawn, and the options that override what is detected. Every plan reads an injected
// env, never the process's. Beside it, built into the same test_plan: test_plan_environment.cpp
// (--dry-run's JSON, each rank's environment), test_plan_edge.cpp (uneven layouts and edge
// cases), test_plan_pytorchjob.cpp (Kubeflow PyTorchJob pods), test_plan_binding.cpp (cpu binding).
#include <doctest/doctest.h>

#include "idist/launchers/plan.hpp"
#include "idist/launchers/ports.hpp"
#include "launcher_envs.hpp"
#include "plan_helpers.hpp"

using namespace idist;
using namespace idist::launchers;
using namespace test;

namespace {

bool in_default_range(int port) {
  const PortRange range;
  return port >= range.first && port <= range.last;
}

}  // namespace

// ---------------------------------------------------------------- spawn without a scheduler

TEST_CASE("plain spawn -n 3") {
  const auto plan = make_plan(options(3), from({}));
  CHECK(plan.mode == Mode::spawn);
  CHECK(plan.local_count == 3);
  CHECK(plan.job.launcher == "spawn");
  CHECK(plan.job.world_size == 3);
  CHECK(plan.job.local_world_size == 3);
  CHECK(plan.job.nnodes == 1);
  CHECK(plan.job.master_addr == "127.0.0.1");
  CHECK(plan.job.master_port == 0);  // dry run: reserved at launch
  CHECK_FALSE(plan.port_reservation);
  CHECK(plan.detected_by.empty());
  CHECK_FALSE(plan.job.job_token.empty());
  CHECK(plan.command == std::vector<std::string>{"/bin/true"});
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    CHECK(rank_contract(plan, i).rank == i);
    CHECK(rank_contract(plan, i).local_rank == i);
  }
}

TEST_CASE("spawn reserves the master port unless it is a dry run") {
  auto o = options(2);
  o.dry_run = false;
  const auto plan = make_plan(o, from({}));
  REQUIRE(plan.port_reservation);
  CHECK(plan.job.master_port == plan.port_reservation->port());
  CHECK(plan.job.master_port > 0);
  // An explicit port is used as given, and nothing is held.
  o.master_port = 23456;
  const auto given = make_plan(o, from({}));
  CHECK(given.job.master_port == 23456);
  CHECK_FALSE(given.port_reservation);
  CHECK(given.provenance.at("master_port") == "--master-port");
}

TEST_CASE("static multi-node: node 1 of 2 runs ranks 4..7") {
  auto o = options(4);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "h0";
  o.rdzv_id = "job-7f3a";
  const auto plan = make_plan(o, from({}));
  CHECK(plan.mode == Mode::spawn);
  CHECK(plan.job.launcher == "spawn");
  CHECK(plan.local_count == 4);
  CHECK(plan.job.world_size == 8);
  CHECK(plan.job.nnodes == 2);
  CHECK(plan.job.node_rank == 1);
  CHECK(plan.job.master_addr == "h0");
  // --master-addr's port is where the nodes meet; rank 0's store gets a fresh port each attempt.
  CHECK(plan.job.master_port == 0);
  REQUIRE(plan.rendezvous);
  CHECK(plan.rendezvous->host == "h0");
  CHECK(plan.rendezvous->port == kDefaultMasterPort);
  CHECK(plan.rendezvous->node_rank == 1);
  CHECK(plan.provenance.at("master_addr") == "--master-addr");
  CHECK(plan.provenance.at("node_rank") == "--node-rank");
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    const auto c = rank_contract(plan, i);
    CHECK(c.rank == 4 + i);
    CHECK(c.local_rank == i);
    CHECK(c.world_size == 8);
    CHECK(c.local_world_size == 4);
  }
  // Every node must name the job alike without talking: from --rdzv-id, which is also the
  // store's token; the run id (in logs and summaries) carries only its hash.
  CHECK(plan.job.job_token == "job-7f3a");
  CHECK(plan.job.run_id.starts_with("rdzv-"));
  CHECK_FALSE(contains(plan.job.run_id, "7f3a"));
  CHECK(make_plan(o, from({})).job.run_id == plan.job.run_id);
  const auto shared = make_plan(o, from({{"IDIST_JOB_TOKEN", "s3cret"}, {"IDIST_RUN_ID", "exp1"}}));
  CHECK(shared.job.job_token == "s3cret");
  CHECK(shared.job.run_id == "exp1");
  o.rdzv_id.reset();
  CHECK(make_plan(o, from({{"IDIST_JOB_TOKEN", "s3cret"}})).job.run_id == "static-h0-29500");
}

TEST_CASE("static multi-node without the job's identity is refused: a stranger could end the job") {
  auto o = options(2);
  o.nnodes = 2;
  o.node_rank = 0;
  o.master_addr = "h0";
  const auto msg = usage_error(o);
  CHECK(contains(msg, "--rdzv-id"));
  CHECK(contains(msg, "IDIST_JOB_TOKEN"));
  CHECK(contains(usage_error(o, {{"IDIST_JOB_TOKEN", ""}}), "--rdzv-id"));
}

TEST_CASE("contradictory static options are usage errors") {
  auto two_nodes = options(4);
  two_nodes.nnodes = 2;
  CHECK(contains(usage_error(two_nodes), "--master-addr"));

  auto rank_only = options(4);
  rank_only.node_rank = 1;
  CHECK(contains(usage_error(rank_only), "--nnodes"));

  auto beyond = options(4);
  beyond.nnodes = 2;
  beyond.node_rank = 2;
  beyond.master_addr = "h0";
  const auto msg = usage_error(beyond);
  CAPTURE(msg);
  CHECK(contains(msg, "--node-rank 2"));
  CHECK(contains(msg, "--nnodes 2"));

  auto with_slurm = options(4);
  with_slurm.nnodes = 2;
  with_slurm.master_addr = "h0";
  with_slurm.launcher = "slurm";
  CHECK(contains(usage_error(with_slurm), "--launcher slurm"));
}

TEST_CASE("static options win over a SLURM step") {
  auto o = options(2);
  o.nnodes = 2;
  o.node_rank = 0;
  o.master_addr = "h0";
  o.rdzv_id = "r1";
  const auto plan = make_plan(o, from(kSrunCyclicTask1));
  CHECK(plan.job.launcher == "spawn");
  CHECK(plan.job.world_size == 4);
}

TEST_CASE("an sbatch batch script spawns locally instead of claiming rank 0 of 4") {
  const auto plan = make_plan(options(), from(kSbatchScript));
  CHECK(plan.job.launcher == "spawn");
  CHECK(plan.mode == Mode::spawn);
  CHECK(plan.job.world_size == 1);
  CHECK(plan.local_count == 1);
  CHECK(any_note(plan, "SLURM_STEP_ID"));
}

// ---------------------------------------------------------------- under an outer launcher

TEST_CASE("exec in place under a SLURM step") {
  for (auto nproc : {std::optional<int>{}, std::optional<int>{1}}) {
    CAPTURE(nproc.value_or(0));
    const auto plan = make_plan(options(nproc), from(kSrunCyclicTask1));
    CHECK(plan.mode == Mode::exec);
    CHECK(plan.local_count == 1);
    CHECK(plan.detected_by == "SLURM step");
    CHECK(plan.job.launcher == "slurm");
    CHECK(plan.job.rank == 1);
    CHECK(plan.job.world_size == 3);
    CHECK(plan.job.local_rank == 0);
    CHECK(plan.job.local_world_size == 1);
    CHECK(plan.job.node_rank == 1);
    CHECK(plan.job.nnodes == 2);
    CHECK(plan.job.master_addr == "node1");
    CHECK(in_default_range(plan.job.master_port));
    CHECK(plan.hosts == std::vector<std::string>{"node1", "node2"});
    CHECK(plan.job.run_id == "slurm-5.0");
    CHECK(plan.provenance.at("rank") == "SLURM_PROCID");
    CHECK(plan.provenance.at("world_size") == "SLURM_STEP_NUM_TASKS");
    CHECK(contains(plan.provenance.at("master_addr"), "SLURM_STEP_NODELIST"));
    CHECK(contains(plan.provenance.at("master_port"), "SLURM_JOB_ID"));
  }
  // Every task of the step derives the same port; the next step another one.
  const int port = make_plan(options(), from(kSrunCyclicTask1)).job.master_port;
  CHECK(make_plan(options(), from(kSrunCyclicTask2)).job.master_port == port);
  CHECK(make_plan(options(), from(with(kSrunCyclicTask1, {{"SLURM_STEP_ID", "1"}}))).job.master_port != port);
}

TEST_CASE("per-node spawn under srun --ntasks-per-node=1") {
  const auto plan = make_plan(options(2), from(kSrunOnePerNodeTask1));
  CHECK(plan.mode == Mode::spawn);
  CHECK(plan.job.launcher == "slurm");
  CHECK(plan.local_count == 2);
  CHECK(plan.job.world_size == 4);
  CHECK(plan.job.local_world_size == 2);
  CHECK(plan.job.node_rank == 1);
  CHECK(plan.job.nnodes == 2);
  CHECK(plan.job.master_addr == "node1");
  const auto first = rank_contract(plan, 0);
  const auto second = rank_contract(plan, 1);
  CHECK(first.rank == 2);
  CHECK(second.rank == 3);
  CHECK(first.local_rank == 0);
  CHECK(second.local_rank == 1);
  CHECK_FALSE(plan.port_reservation);  // the port is derived: no node could share a reserved one
}

TEST_CASE("-n K on a node that already runs several tasks is refused unless --force-spawn") {
  const Env eight_tasks = {{"SLURM_JOB_ID", "8"},         {"SLURM_STEP_ID", "0"},          {"SLURM_PROCID", "3"},
                           {"SLURM_LOCALID", "3"},        {"SLURM_NODEID", "0"},           {"SLURM_NTASKS", "8"},
                           {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_STEP_NUM_NODES", "1"},
                           {"SLURM_STEP_TASKS_PER_NODE", "8"}, {"SLURM_STEP_NODELIST", "n1"}};
  const auto msg = usage_error(options(8), eight_tasks);
  CAPTURE(msg);
  CHECK(contains(msg, "--force-spawn"));
  CHECK(contains(msg, "64"));

  auto forced = options(8);
  forced.force_spawn = true;
  const auto plan = make_plan(forced, from(eight_tasks));
  CHECK(plan.mode == Mode::spawn);
  CHECK(plan.job.world_size == 64);
  CHECK(plan.job.local_world_size == 64);
  CHECK(rank_contract(plan, 0).rank == 24);
  CHECK(rank_contract(plan, 7).rank == 31);
  CHECK(rank_contract(plan, 7).local_rank == 31);
}

TEST_CASE("detection off under a SLURM step: spawn -n here") {
  auto no_detect = options(3);
  no_detect.no_detect = true;
  auto spawn = options(3);
  spawn.launcher = "spawn";
  for (const auto& o : {no_detect, spawn}) {
    const auto plan = make_plan(o, from(kSrunCyclicTask1));
    CHECK(plan.mode == Mode::spawn);
    CHECK(plan.job.launcher == "spawn");
    CHECK(plan.job.world_size == 3);
    CHECK(plan.local_count == 3);
    CHECK(plan.job.nnodes == 1);
    CHECK(any_note(plan, "detection off"));
  }
}

TEST_CASE("explicit and exported master address and port win over detected ones") {
  auto o = options();
  o.master_addr = "10.9.9.9";
  o.master_port = 12345;
  const auto plan = make_plan(o, from(with(kSrunCyclicTask1, {{"MASTER_ADDR", "x"}, {"MASTER_PORT", "1"}})));
  CHECK(plan.job.master_addr == "10.9.9.9");
  CHECK(plan.job.master_port == 12345);
  CHECK(plan.provenance.at("master_addr") == "--master-addr");
  CHECK(plan.provenance.at("master_port") == "--master-port");

  const auto exported =
      make_plan(options(), from(with(kSrunCyclicTask1, {{"MASTER_ADDR", "node2"}, {"MASTER_PORT", "31000"}})));
  CHECK(exported.job.master_addr == "node2");
  CHECK(exported.job.master_port == 31000);
  CHECK(exported.provenance.at("master_addr") == "MASTER_ADDR");
  CHECK(exported.provenance.at("master_port") == "MASTER_PORT");

  CHECK_THROWS_WITH_AS(make_plan(options(), from(with(kSrunCyclicTask1, {{"MASTER_PORT", "70000"}}))),
                       doctest::Contains("MASTER_PORT='70000'"), DetectError);
}

TEST_CASE("mpirun on one host: rank 0 is local, the port comes from the job id") {
  const auto one = make_plan(options(), from(kOmpiRank1));
  const auto zero = make_plan(options(), from(kOmpiRank0));
  CHECK(one.mode == Mode::exec);
  CHECK(one.job.launcher == "mpi");
  CHECK(one.job.rank == 1);
  CHECK(zero.job.rank == 0);
  CHECK(one.job.master_addr == "127.0.0.1");
  CHECK(contains(one.provenance.at("master_addr"), "every rank on this node"));
  CHECK(one.job.master_port == zero.job.master_port);
  CHECK(in_default_range(one.job.master_port));
  CHECK(contains(one.provenance.at("master_port"), "OMPI_MCA_ess_base_jobid"));
  CHECK(one.job.run_id == zero.job.run_id);

  auto ranged = options();
  ranged.port_range = parse_port_range("--port-range", "40000-40009");
  const int port = make_plan(ranged, from(kOmpiRank1)).job.master_port;
  CHECK(port >= 40000);
  CHECK(port <= 40009);
}

TEST_CASE("--launcher mpi under a SLURM step that disagrees") {
  auto o = options();
  o.launcher = "mpi";
  const auto plan = make_plan(o, from(with(kSrunCyclicTask1, kOmpiRank0)));
  CHECK(plan.job.launcher == "mpi");
  CHECK(plan.job.rank == 0);
  CHECK(any_note(plan, "ignoring SLURM step"));
  // Without it the disagreement is an error, not a guess.
  CHECK_THROWS_AS(make_plan(options(), from(with(kSrunCyclicTask1, kOmpiRank0))), DetectError);
}

TEST_CASE("horovodrun across hosts needs --master-addr") {
  const auto msg = usage_error(options(), kHorovodRank3);
  CAPTURE(msg);
  CHECK(contains(msg, "--master-addr"));
  CHECK(contains(msg, "HOROVOD_SIZE=4"));

  auto o = options();
  o.master_addr = "hosta";
  const auto plan = make_plan(o, from(kHorovodRank3));
  CHECK(plan.mode == Mode::exec);
  CHECK(plan.job.launcher == "horovod");
  CHECK(plan.job.master_addr == "hosta");
  CHECK(plan.job.rank == 3);
  CHECK(plan.job.node_rank == 1);
  CHECK(in_default_range(plan.job.master_port));
  CHECK(contains(plan.provenance.at("master_port"), "HOROVOD_GLOO_RENDEZVOUS"));
}

TEST_CASE("MPICH/Hydra across hosts needs --master-addr; the port comes from the PMI server's job name") {
  CHECK(contains(usage_error(options(), kHydraRank2), "--master-addr"));
  auto o = options();
  o.master_addr = "h0";
  const auto plan = make_plan(o, from(kHydraRank2));
  CHECK(plan.job.node_rank == 1);
  CHECK(plan.job.nnodes == 2);
  CHECK(plan.job.master_port == derived_port("kvs_4242_0_12345_hosta", 0, PortRange{}));
  CHECK(contains(plan.provenance.at("master_port"), "PMI server"));
  CHECK(plan.job.run_id == "mpi-kvs_4242_0_12345_hosta");
  CHECK(contains(plan.provenance.at("node_rank"), "assumes"));
  // Two Hydra jobs: two names, two ports, two tokens.
  auto other = o;
  other.pmi = [](const PmiEndpoint&) { return PmiAnswer{.kvsname = "kvs_4243_0_999_hosta", .rank = {}, .size = {}}; };
  const auto second = make_plan(other, from(kHydraRank2));
  CHECK(second.job.master_port != plan.job.master_port);
  CHECK(second.job.job_token != plan.job.job_token);
  CHECK_FALSE(plan.job.job_token.empty());
}

TEST_CASE("a launcher that names no job: refused, never a fixed port two jobs would share") {
  const Env mvapich = {{"MV2_COMM_WORLD_RANK", "1"}, {"MV2_COMM_WORLD_SIZE", "2"},
                       {"MV2_COMM_WORLD_LOCAL_RANK", "1"}, {"MV2_COMM_WORLD_LOCAL_SIZE", "2"}};
  const auto msg = usage_error(options(), mvapich);
  CHECK(contains(msg, "--master-port"));
  CHECK(contains(msg, "--rdzv-id"));
  auto o = options();
  o.rdzv_id = "exp-42";
  const auto plan = make_plan(o, from(mvapich));
  CHECK(plan.job.master_port == derived_port("exp-42", 0, PortRange{}));
  CHECK(plan.job.job_token == "exp-42");
  o.rdzv_id.reset();
  o.master_port = 29611;
  CHECK(make_plan(o, from(mvapich)).job.master_port == 29611);
  // The job's only task spawning every rank itself: a free port here is unique.
  const Env one_task = with(mvapich, {{"MV2_COMM_WORLD_RANK", "0"}, {"MV2_COMM_WORLD_SIZE", "1"},
                                      {"MV2_COMM_WORLD_LOCAL_RANK", "0"}, {"MV2_COMM_WORLD_LOCAL_SIZE", "1"}});
  auto spawn = options(3);
  spawn.dry_run = false;
  const auto local = make_plan(spawn, from(one_task));
  CHECK(local.port_reservation);
  CHECK(local.job.master_port == local.port_reservation->port());
}

TEST_CASE("torchrun's env: exec with its master address and port") {
  const auto plan = make_plan(options(), from(kTorchrunRank1));
  CHECK(plan.mode == Mode::exec);
  CHECK(plan.job.launcher == "env");
  CHECK(plan.job.rank == 1);
  CHECK(plan.job.world_size == 4);
  CHECK(plan.job.master_addr == "10.1.1.1");
  CHECK(plan.job.master_port == 29400);
  CHECK(plan.provenance.at("master_addr") == "MASTER_ADDR");
  CHECK(plan.provenance.at("master_port") == "MASTER_PORT");
  CHECK(plan.job.run_id == "env-abc");
}

TEST_CASE("the backend option reaches the contract") {
  auto o = options(2);
  o.backend = "gloo";
  CHECK(make_plan(o, from({})).job.backend == "gloo");
  o.nproc_per_node.reset();
  CHECK(make_plan(o, from(kSrunCyclicTask1)).job.backend == "gloo");
}

TEST_CASE("--backend mpi: ranks come from mpirun; spawning several is refused up front") {
  auto o = options(3);
  o.backend = "mpi";
  CHECK(usage_error(o) ==
        "--backend mpi needs its ranks started by mpirun, not spawned by idist-run: run `mpirun -np 3 idist-run "
        "--backend mpi ...`, or use --backend gloo");
  o.nproc_per_node.reset();
  CHECK(make_plan(o, from(kOmpiRank1)).mode == Mode::exec);  // under mpirun: exec in place
  CHECK(make_plan(o, from({})).job.world_size == 1);          // a world of one is MPI's singleton
}
