// Launch plans: plain and static multi-node spawn, exec in place under an outer launcher,
// per-node spawn, the options that override what is detected, --dry-run's JSON and the
// environment each rank gets. Every plan reads an injected env, never the process's.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "idist/launchers/plan.hpp"
#include "idist/launchers/program.hpp"
#include "idist/launchers/resources.hpp"
#include "launcher_envs.hpp"

using namespace idist;
using namespace idist::launchers;
using namespace test;

namespace {

// Options as the command line gives them; dry run, so that no test reserves a port by accident.
LaunchOptions options(std::optional<int> nproc = std::nullopt) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.dry_run = true;
  o.command = {"/bin/true"};
  o.pmi = fake_pmi;
  return o;
}

// The UsageError's message, or "no error".
std::string usage_error(const LaunchOptions& o, const Env& vars = {}) {
  try {
    make_plan(o, from(vars));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

bool any_note(const LaunchPlan& plan, std::string_view part) {
  return std::any_of(plan.notes.begin(), plan.notes.end(), [&](const auto& n) { return contains(n, part); });
}

bool in_default_range(int port) {
  const PortRange range;
  return port >= range.first && port <= range.last;
}

// rank_environment's output as a map, for lookups.
std::map<std::string, std::string> environment_of(const LaunchPlan& plan, int index, std::vector<std::string> base) {
  std::vector<char*> environ_like;
  for (auto& entry : base) environ_like.push_back(entry.data());
  environ_like.push_back(nullptr);
  std::map<std::string, std::string> out;
  for (const auto& entry : rank_environment(plan, index, environ_like.data())) {
    const auto eq = entry.find('=');
    REQUIRE(eq != std::string::npos);
    out[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return out;
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

// ---------------------------------------------------------------- --dry-run

TEST_CASE("dry_run_json: a spawn plan") {
  const auto plan = make_plan(options(2), from({}));
  const auto text = dry_run_json(plan);
  const auto j = nlohmann::json::parse(text);
  CHECK(j.at("launcher") == "spawn");
  CHECK(j.at("mode") == "spawn");
  CHECK(j.at("backend").is_null());  // the program's choice
  CHECK(j.at("world_size") == 2);
  CHECK(j.at("nnodes") == 1);
  CHECK(j.at("node_rank") == 0);
  CHECK(j.at("local_world_size") == 2);
  CHECK(j.at("master_addr") == "127.0.0.1");
  CHECK(j.at("master_port").is_null());  // picked at launch
  CHECK(j.at("hosts").is_array());
  CHECK(j.at("hosts").size() == 1);
  for (const auto* key : {"rank", "world_size", "local_rank", "node_rank", "master_addr", "master_port"}) {
    CAPTURE(key);
    CHECK(j.at("provenance").contains(key));
  }
  REQUIRE(j.at("ranks").size() == 2);
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    const auto& r = j.at("ranks").at(static_cast<std::size_t>(i));
    CHECK(r.at("rank") == i);
    CHECK(r.at("local_rank") == i);
    CHECK(r.at("env").at("RANK") == std::to_string(i));
    CHECK(r.at("env").at("WORLD_SIZE") == "2");
    CHECK(r.at("env").at("MASTER_PORT") == "<picked at launch>");
    CHECK(r.at("env").at("IDIST_JOB_TOKEN") == "<hidden>");
  }
  // The secret never appears in clear.
  REQUIRE_FALSE(plan.job.job_token.empty());
  CHECK_FALSE(contains(text, plan.job.job_token));
}

TEST_CASE("dry_run_json: exec under a SLURM step") {
  auto o = options();
  o.backend = "gloo";
  const auto plan = make_plan(o, from(with(kSrunCyclicTask1, {{"IDIST_JOB_TOKEN", "do-not-print-me"}})));
  const auto text = dry_run_json(plan);
  const auto j = nlohmann::json::parse(text);
  CHECK(j.at("launcher") == "slurm");
  CHECK(j.at("mode") == "exec");
  CHECK(j.at("detected_by") == "SLURM step");
  CHECK(j.at("backend") == "gloo");
  CHECK(j.at("world_size") == 3);
  CHECK(j.at("nnodes") == 2);
  CHECK(j.at("node_rank") == 1);
  CHECK(j.at("local_world_size") == 1);
  CHECK(j.at("master_addr") == "node1");
  CHECK(j.at("master_port") == plan.job.master_port);
  CHECK(j.at("hosts") == nlohmann::json::array({"node1", "node2"}));
  CHECK(j.at("provenance").at("rank") == "SLURM_PROCID");
  CHECK(j.at("provenance").at("world_size") == "SLURM_STEP_NUM_TASKS");
  CHECK(j.at("provenance").at("local_rank") == "SLURM_LOCALID");
  CHECK(j.at("provenance").at("node_rank") == "SLURM_NODEID");
  REQUIRE(j.at("ranks").size() == 1);
  CHECK(j.at("ranks").at(0).at("rank") == 1);
  CHECK(j.at("ranks").at(0).at("env").at("IDIST_LAUNCHER") == "slurm");
  CHECK(j.at("ranks").at(0).at("env").at("MASTER_PORT") == std::to_string(plan.job.master_port));
  CHECK(j.at("ranks").at(0).at("env").at("IDIST_JOB_TOKEN") == "<hidden>");
  CHECK_FALSE(contains(text, "do-not-print-me"));
}

// ---------------------------------------------------------------- each rank's environment

TEST_CASE("rank_environment keeps an inherited OMP_NUM_THREADS and sets one otherwise") {
  const auto plan = make_plan(options(2), from({}));
  const auto kept = environment_of(plan, 1, {"PATH=/usr/bin", "OMP_NUM_THREADS=3"});
  CHECK(kept.at("OMP_NUM_THREADS") == "3");
  CHECK(kept.at("PATH") == "/usr/bin");

  const auto set = environment_of(plan, 1, {"PATH=/usr/bin"});
  REQUIRE(set.count("OMP_NUM_THREADS") == 1);
  CHECK(std::stoi(set.at("OMP_NUM_THREADS")) >= 1);
}

TEST_CASE("every rank gets PYTHONUNBUFFERED=1 unless it is set, and --dry-run shows it") {
  // A rank's stdout is a pipe: python3 train.py would hold its output back until it exits.
  const auto plan = make_plan(options(2), from({}));
  CHECK(environment_of(plan, 1, {"PATH=/usr/bin"}).at("PYTHONUNBUFFERED") == "1");
  const auto shown = nlohmann::json::parse(dry_run_json(plan));
  CHECK(shown["ranks"][1]["env"]["PYTHONUNBUFFERED"] == "1");

  const auto users = make_plan(options(2), from({{"PYTHONUNBUFFERED", ""}}));
  CHECK(environment_of(users, 0, {"PYTHONUNBUFFERED="}).at("PYTHONUNBUFFERED") == "");
  CHECK_FALSE(nlohmann::json::parse(dry_run_json(users))["ranks"][0]["env"].contains("PYTHONUNBUFFERED"));
}

TEST_CASE("rank_environment sets the contract over what the outer job left") {
  const auto plan = make_plan(options(2), from({}));
  const auto vars = environment_of(
      plan, 1, {"RANK=9", "WORLD_SIZE=10", "IDIST_JOB_TOKEN=stale", "IDIST_RUN_ID=old", "IDIST_LAUNCHER=slurm", "X=1"});
  CHECK(vars.at("RANK") == "1");
  CHECK(vars.at("LOCAL_RANK") == "1");
  CHECK(vars.at("WORLD_SIZE") == "2");
  CHECK(vars.at("LOCAL_WORLD_SIZE") == "2");
  CHECK(vars.at("NODE_RANK") == "0");
  CHECK(vars.at("GROUP_RANK") == "0");
  CHECK(vars.at("GROUP_WORLD_SIZE") == "1");
  CHECK(vars.at("MASTER_ADDR") == "127.0.0.1");
  CHECK(vars.count("MASTER_PORT") == 1);
  CHECK(vars.at("IDIST_LAUNCHER") == "spawn");
  CHECK(vars.at("IDIST_JOB_TOKEN") == plan.job.job_token);
  CHECK(vars.at("IDIST_RUN_ID") == plan.job.run_id);
  CHECK(vars.at("X") == "1");
}

namespace {

// A task's variables as its environ: the base that rank_environment starts from.
std::vector<std::string> environ_of(const Env& vars) {
  std::vector<std::string> out;
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

// Only the SLURM_* variables of an environment.
Env slurm_part(const std::map<std::string, std::string>& vars) {
  Env out;
  for (const auto& [name, value] : vars)
    if (name.starts_with("SLURM_")) out[name] = value;
  return out;
}

}  // namespace

TEST_CASE("ranks spawned under srun --ntasks-per-node=1 see the SLURM variables of tasks of their own") {
  // srun -N2 --ntasks-per-node=1 idist-run -n 2, the task on node 1: it spawns ranks 2 and 3 of 4.
  const Env task = with(kSrunOnePerNodeTask1, {{"SLURM_NPROCS", "2"},
                                               {"SLURM_NTASKS_PER_NODE", "1"},
                                               {"SLURM_GTIDS", "1"},
                                               {"SLURM_TASK_PID", "4242"},
                                               {"SLURM_JOB_NUM_NODES", "2"}});
  const auto plan = make_plan(options(2), from(task));
  REQUIRE(plan.mode == Mode::spawn);
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    const auto vars = environment_of(plan, i, environ_of(task));
    // What ignite.distributed and Lightning compare, and what srun -N2 --ntasks-per-node=2 gives.
    CHECK(vars.at("SLURM_PROCID") == vars.at("RANK"));
    CHECK(vars.at("SLURM_PROCID") == std::to_string(2 + i));
    CHECK(vars.at("SLURM_LOCALID") == vars.at("LOCAL_RANK"));
    CHECK(vars.at("SLURM_LOCALID") == std::to_string(i));
    for (const char* name : {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"}) CHECK(vars.at(name) == "4");
    CHECK(vars.at("WORLD_SIZE") == "4");
    CHECK(vars.at("SLURM_STEP_TASKS_PER_NODE") == "2(x2)");
    CHECK(vars.at("SLURM_TASKS_PER_NODE") == "2(x2)");
    CHECK(vars.at("SLURM_NTASKS_PER_NODE") == "2");
    CHECK(vars.at("SLURM_GTIDS") == "2,3");
    // Per node or per job, or the task's own: as they were.
    for (const char* name : {"SLURM_NODEID", "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
                             "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEP_NODELIST", "SLURM_TASK_PID"})
      CHECK(vars.at(name) == task.at(name));
    // Nothing the task did not have: no variable appears that srun did not set.
    CHECK(slurm_part(vars).size() == task.size());
  }
}

TEST_CASE("--force-spawn on uneven cyclic nodes: each rank's SLURM view is node-major, as its RANK") {
  // srun -N2 -n5 --distribution=cyclic idist-run --force-spawn -n 2: tasks per node 3,2. Task 3
  // (node 1, local 1) spawns ranks 8 and 9 of 10; node 1 holds ranks 6-9.
  const Env task = {{"SLURM_JOB_ID", "9"},         {"SLURM_STEP_ID", "0"},         {"SLURM_PROCID", "3"},
                    {"SLURM_NODEID", "1"},         {"SLURM_LOCALID", "1"},         {"SLURM_NTASKS", "5"},
                    {"SLURM_STEP_NUM_TASKS", "5"}, {"SLURM_STEP_NUM_NODES", "2"},  {"SLURM_STEP_TASKS_PER_NODE", "3,2"},
                    {"SLURM_TASKS_PER_NODE", "3,2"}, {"SLURM_STEP_NODELIST", "n[1-2]"}, {"SLURM_GTIDS", "1,3"},
                    {"SLURM_DISTRIBUTION", "cyclic"}};
  auto o = options(2);
  o.force_spawn = true;
  const auto plan = make_plan(o, from(task));
  for (int i = 0; i < 2; ++i) {
    CAPTURE(i);
    const auto vars = environment_of(plan, i, environ_of(task));
    CHECK(vars.at("SLURM_PROCID") == std::to_string(8 + i));
    CHECK(vars.at("SLURM_LOCALID") == std::to_string(2 + i));
    CHECK(vars.at("LOCAL_RANK") == vars.at("SLURM_LOCALID"));
    CHECK(vars.at("SLURM_NTASKS") == "10");
    CHECK(vars.at("SLURM_STEP_TASKS_PER_NODE") == "6,4");
    CHECK(vars.at("SLURM_TASKS_PER_NODE") == "6,4");
    CHECK(vars.at("SLURM_GTIDS") == "6,7,8,9");
    CHECK(vars.at("SLURM_DISTRIBUTION") == "cyclic");  // srun reads it as an option: a nested srun's
  }
}

TEST_CASE("the rewritten tasks per node keep SLURM's compressed form") {
  const Env task = {{"SLURM_JOB_ID", "3"},         {"SLURM_STEP_ID", "1"},        {"SLURM_PROCID", "0"},
                    {"SLURM_NODEID", "0"},         {"SLURM_LOCALID", "0"},        {"SLURM_NTASKS", "4"},
                    {"SLURM_STEP_NUM_NODES", "4"}, {"SLURM_STEP_TASKS_PER_NODE", "1(x4)"},
                    {"SLURM_STEP_NODELIST", "gpu[001-004]"}, {"SLURM_GTIDS", "0"}};
  const auto vars = environment_of(make_plan(options(8), from(task)), 7, environ_of(task));
  CHECK(vars.at("SLURM_STEP_TASKS_PER_NODE") == "8(x4)");
  CHECK(vars.at("SLURM_NTASKS") == "32");
  CHECK(vars.at("SLURM_GTIDS") == "0,1,2,3,4,5,6,7");
  CHECK(vars.count("SLURM_TASKS_PER_NODE") == 0);
}

TEST_CASE("the SLURM variables stay the task's with --keep-slurm-env, in exec mode and without detection") {
  const Env task = with(kSrunOnePerNodeTask1, {{"SLURM_GTIDS", "1"}});
  auto keep = options(2);
  keep.keep_slurm_env = true;
  auto undetected = options(2);
  undetected.launcher = "spawn";  // the user says these ranks are no SLURM tasks
  for (const auto& o : {keep, options(), undetected}) {
    const auto plan = make_plan(o, from(task));
    CAPTURE(plan.job.launcher);
    CAPTURE(plan.local_count);
    const auto vars = environment_of(plan, plan.local_count - 1, environ_of(task));
    CHECK(slurm_part(vars) == task);
  }
}

// ---------------------------------------------------------------- uneven layouts and edge cases

TEST_CASE("a doubled launch on uneven nodes is refused on every node, not only the busy one") {
  // srun -N2 -n3 idist-run -n 2: node 0 runs 2 tasks, node 1 one. Were node 1 to start, its
  // ranks would wait for node 0's until the timeout.
  for (const auto& task : {kSrunCyclicTask1, kSrunCyclicTask2}) {
    const auto msg = usage_error(options(2), task);
    CAPTURE(msg);
    CHECK(contains(msg, "runs up to 2 tasks on a node (tasks per node 2,1)"));
    CHECK(contains(msg, "--force-spawn"));
  }
}

TEST_CASE("--force-spawn on uneven cyclic nodes: global ranks stay node-major") {
  // srun -N2 -n5 --distribution=cyclic, tasks per node 3,2; each task spawns 2 ranks.
  const Env base = {{"SLURM_JOB_ID", "9"},          {"SLURM_STEP_ID", "0"},
                    {"SLURM_STEP_NUM_TASKS", "5"},  {"SLURM_STEP_NUM_NODES", "2"},
                    {"SLURM_STEP_TASKS_PER_NODE", "3,2"}, {"SLURM_STEP_NODELIST", "n[1-2]"}};
  auto o = options(2);
  o.force_spawn = true;
  // (procid, nodeid, localid) under cyclic placement -> the first global rank it spawns.
  const std::vector<std::tuple<int, int, int, int>> tasks = {
      {0, 0, 0, 0}, {1, 1, 0, 6}, {2, 0, 1, 2}, {3, 1, 1, 8}, {4, 0, 2, 4}};
  std::vector<int> seen;
  for (const auto& [procid, nodeid, localid, first] : tasks) {
    const auto plan = make_plan(o, from(with(base, {{"SLURM_PROCID", std::to_string(procid)},
                                                    {"SLURM_NODEID", std::to_string(nodeid)},
                                                    {"SLURM_LOCALID", std::to_string(localid)}})));
    CAPTURE(procid);
    CHECK(plan.job.world_size == 10);
    CHECK(rank_contract(plan, 0).rank == first);
    CHECK(rank_contract(plan, 0).local_rank == localid * 2);
    CHECK(plan.job.local_world_size == (nodeid == 0 ? 6 : 4));
    for (int i = 0; i < plan.local_count; ++i) seen.push_back(rank_contract(plan, i).rank);
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
}

TEST_CASE("per-node spawn under a one-task job makes its own token; several tasks cannot") {
  const Env one_task = with(kSrunOnePerNodeTask1, {{"SLURM_PROCID", "0"},
                                                   {"SLURM_NODEID", "0"},
                                                   {"SLURM_STEP_NUM_TASKS", "1"},
                                                   {"SLURM_NTASKS", "1"},
                                                   {"SLURM_STEP_NUM_NODES", "1"},
                                                   {"SLURM_NNODES", "1"},
                                                   {"SLURM_STEP_TASKS_PER_NODE", "1"},
                                                   {"SLURM_STEP_NODELIST", "node1"}});
  CHECK(make_plan(options(3), from(one_task)).job.job_token.size() == 32);
  // Several tasks: a token they all derive from the job's id, which keeps jobs apart.
  const auto two_nodes = make_plan(options(3), from(kSrunOnePerNodeTask1));
  CHECK(two_nodes.job.job_token.starts_with("job-"));
  CHECK(any_note(two_nodes, "IDIST_JOB_TOKEN is not set"));
  auto other_job = kSrunOnePerNodeTask1;
  other_job["SLURM_JOB_ID"] += "1";
  CHECK(make_plan(options(3), from(other_job)).job.job_token != two_nodes.job.job_token);
  CHECK(make_plan(options(3), from(with(kSrunOnePerNodeTask1, {{"IDIST_JOB_TOKEN", "s3cret"}}))).job.job_token ==
        "s3cret");
}

TEST_CASE("a job too large for the contract is refused, not wrapped around") {
  const auto msg = usage_error(options(4096), {{"RANK", "0"}, {"WORLD_SIZE", "1000000"}, {"LOCAL_RANK", "0"},
                                               {"LOCAL_WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  CHECK(contains(msg, "more than idist handles"));
}

TEST_CASE("an explicit --launcher beats IDIST_NO_DETECT") {
  auto o = options();
  o.no_detect = true;
  CHECK(make_plan(o, from(kSrunCyclicTask1)).job.launcher == "spawn");
  o.launcher = "slurm";
  CHECK(make_plan(o, from(kSrunCyclicTask1)).job.launcher == "slurm");
}

TEST_CASE("under torchrun's agent store the ranks create rank 0's store instead of joining torchrun's") {
  const Env env = with(kTorchrunRank1, {{"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  const auto plan = make_plan(options(), from(env));
  CHECK(plan.job.master_port != 29400);
  CHECK(contains(plan.provenance.at("master_port"), "agent store"));
  char entry[] = "TORCHELASTIC_USE_AGENT_STORE=True";
  char* base[] = {entry, nullptr};
  const auto vars = rank_environment(plan, 0, base);
  CHECK(std::none_of(vars.begin(), vars.end(), [](const auto& v) { return v.starts_with("TORCHELASTIC_USE_AGENT_STORE="); }));
}

TEST_CASE("an outer job's descriptors (flight recorder, cpus-shared notice) reach a rank we exec, not one we spawn") {
  const std::vector<std::string> outer = {"IDIST_RECORDER_FD=5", "IDIST_CPUS_SHARED_FD=6"};
  const auto spawned = environment_of(make_plan(options(2), from({})), 0, outer);
  CHECK_FALSE(spawned.contains("IDIST_RECORDER_FD"));
  CHECK_FALSE(spawned.contains("IDIST_CPUS_SHARED_FD"));
  const auto plan = make_plan(options(), from(kTorchrunRank1));
  REQUIRE(plan.mode == Mode::exec);
  const auto execd = environment_of(plan, 0, outer);
  CHECK(execd.at("IDIST_RECORDER_FD") == "5");
  CHECK(execd.at("IDIST_CPUS_SHARED_FD") == "6");
}

TEST_CASE("dry_run_json survives arguments that are not UTF-8") {
  auto o = options(1);
  o.command = {"/bin/echo", "\xff\xfe"};
  CHECK_NOTHROW(nlohmann::json::parse(dry_run_json(make_plan(o, from({})))));
}

TEST_CASE("--local-rank-arg puts --local_rank=N between the program and its arguments") {
  auto o = options(2);
  o.command = {"python3", "-u", "train.py", "--epochs", "3"};
  o.local_rank_arg = true;
  const auto plan = make_plan(o, from({}));
  CHECK(rank_command(plan, 1) == std::vector<std::string>{"python3", "-u", "train.py", "--local_rank=1", "--epochs", "3"});
  o.local_rank_arg = false;
  CHECK(rank_command(make_plan(o, from({})), 1) == o.command);
  // Under an outer launcher (exec in place) N is the task's local rank.
  auto task = options();
  task.command = {"./prog"};
  task.local_rank_arg = true;
  CHECK(rank_command(make_plan(task, from(kSrunCyclicTask2)), 0).back() ==
        "--local_rank=" + std::to_string(make_plan(task, from(kSrunCyclicTask2)).job.local_rank));
}

TEST_CASE("--local-rank-arg goes after the script when the program is a Python interpreter") {
  // The README's form, python3 named by the user: after python3 the interpreter would take
  // --local_rank=1 for its own option and exit 2 on every rank.
  const auto command_of = [](std::vector<std::string> command) {
    auto o = options(2);
    o.command = std::move(command);
    o.local_rank_arg = true;
    return rank_command(make_plan(o, from({})), 1);
  };
  using Words = std::vector<std::string>;
  CHECK(command_of({"/usr/bin/python3", "script.py", "--epochs", "3"}) ==
        Words{"/usr/bin/python3", "script.py", "--local_rank=1", "--epochs", "3"});
  CHECK(command_of({"python3", "-u", "script.py", "--epochs", "3"}) ==
        Words{"python3", "-u", "script.py", "--local_rank=1", "--epochs", "3"});
  CHECK(command_of({"python3", "-m", "pkg.train", "--epochs", "3"}) ==
        Words{"python3", "-m", "pkg.train", "--local_rank=1", "--epochs", "3"});
  CHECK(command_of({"python3.11", "-uB", "-W", "ignore", "-Xdev", "-mpkg", "-x"}) ==
        Words{"python3.11", "-uB", "-W", "ignore", "-Xdev", "-mpkg", "--local_rank=1", "-x"});
  CHECK(command_of({"python", "-c", "import sys", "a"}) == Words{"python", "-c", "import sys", "--local_rank=1", "a"});
  CHECK(command_of({"python3", "-u"}) == Words{"python3", "-u", "--local_rank=1"});
  // Not an interpreter: right after the program, whatever its arguments look like.
  CHECK(command_of({"./python-tool", "train.py"}) == Words{"./python-tool", "--local_rank=1", "train.py"});
  CHECK(command_of({"./train", "-m", "x"}) == Words{"./train", "--local_rank=1", "-m", "x"});
}

TEST_CASE("needed_libraries reads an ELF file's DT_NEEDED entries, and nothing from anything else") {
  const auto libc = needed_libraries("/bin/true");
  CHECK(std::any_of(libc.begin(), libc.end(), [](const auto& name) { return name.starts_with("libc.so"); }));
  CHECK(mpi_library("/bin/true").empty());
  CHECK(needed_libraries("/nonexistent").empty());
  // Cut short, or with section headers pointing past the end: nothing, and no crash.
  const auto path = std::filesystem::temp_directory_path() / ("idist-test-elf-" + std::to_string(::getpid()));
  std::ifstream whole("/bin/true", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
  for (const std::size_t size : {std::size_t{4}, std::size_t{64}, std::size_t{4096}, bytes.size() / 2}) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(size));
    CHECK(needed_libraries(path).empty());
  }
  std::string broken = bytes;
  std::fill(broken.begin() + 0x28, broken.begin() + 0x30, '\xff');  // e_shoff of an ELF64 header
  std::ofstream(path, std::ios::binary).write(broken.data(), static_cast<std::streamsize>(broken.size()));
  CHECK(needed_libraries(path).empty());
  std::ofstream(path) << "#!/bin/sh\n";
  CHECK(needed_libraries(path).empty());
  std::filesystem::remove(path);
}

TEST_CASE("a program that links no MPI library is spawned as usual") {
  auto o = options(2);
  o.program_path = "/bin/true";
  CHECK(make_plan(o, from({})).local_count == 2);
}

TEST_CASE("attempt_of gives every local rank its command, environment and a fresh reserved port on restarts") {
  auto o = options(3);
  o.dry_run = false;  // a real reservation, as idist-run and idist::spawn hold
  auto plan = make_plan(o, from({}));
  char* no_env[] = {nullptr};
  const auto first = attempt_of(plan, "/bin/true", 0, no_env);
  REQUIRE(first.processes.size() == 3);
  CHECK(first.processes[2].rank == 2);
  CHECK(std::find(first.processes[2].env.begin(), first.processes[2].env.end(), "LOCAL_RANK=2") != first.processes[2].env.end());
  const auto second = attempt_of(plan, "/bin/true", 1, no_env);
  CHECK(second.master_port != first.master_port);
  CHECK(std::find(second.processes[0].env.begin(), second.processes[0].env.end(), "IDIST_RESTART_COUNT=1") !=
        second.processes[0].env.end());
}

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

namespace {

// A node of `cpus` cpus, idist-run's mask `mask` of them.
CpuView node(std::vector<int> mask, int cpus, std::string source = "online cpus") {
  CpuView v;
  v.mask = std::move(mask);
  for (int c = 0; c < cpus; ++c) v.allotted.push_back(c);
  v.allotted_source = std::move(source);
  return v;
}

}  // namespace

TEST_CASE("binding by default: each rank a cpu of its own where the ranks fit a mask nobody narrowed") {
  LaunchPlan plan;
  bind_ranks(plan, Bind::where_fits, 2, node({0, 1}, 2));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0}, {1}});
  CHECK(plan.binding.starts_with("bound (the default"));
  bind_ranks(plan, Bind::where_fits, 2, node({0, 1, 2, 3, 4, 5, 6, 7}, 8));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  // A cgroup's cpuset (a container's allotment) is the machine to share, not someone's binding.
  bind_ranks(plan, Bind::where_fits, 2, [] {
    auto v = node({4, 5}, 0, "cgroup cpuset 4-5");
    v.allotted = {4, 5};
    return v;
  }());
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{4}, {5}});
}

TEST_CASE("binding by default leaves out the cpus other idist-run jobs here bound ranks to") {
  LaunchPlan plan;
  auto view = node({0, 1, 2, 3}, 4);
  view.claimed = {0, 1};  // a job of 2 ranks started before us
  bind_ranks(plan, Bind::where_fits, 2, view);
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{2}, {3}});
  CHECK(plan.binding.find("leaving out those other idist-run jobs here bound ranks to cpu(s) 0-1") != std::string::npos);
  // Too few left: unbound, as beside work we cannot see (two fake hosts on one machine).
  bind_ranks(plan, Bind::where_fits, 3, view);
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("other idist-run jobs here bound ranks to cpu(s) 0-1, which leaves fewer than a cpu") !=
        std::string::npos);
  // --bind is the user's word: the whole mask, claimed or not.
  bind_ranks(plan, Bind::always, 2, view);
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
}

TEST_CASE("holding the binding: the chosen cpus are claimed; claimed meanwhile, the binding is chosen again") {
  const auto dir = std::filesystem::temp_directory_path() / ("idist-plan-claims-" + std::to_string(::getpid()));
  const auto env = [&](std::string_view name) -> std::optional<std::string> {
    if (name == kCpuClaimsVar) return dir.string();
    return std::nullopt;
  };
  const auto view = cpu_view(env);
  LaunchPlan plan;
  plan.local_count = 1;
  bind_ranks(plan, Bind::where_fits, 1, view);
  if (plan.cpu_shares.empty()) {
    MESSAGE("skipped: this process's mask is not the machine's (" << plan.binding << ")");
    return;
  }
  {
    const auto held = hold_binding(plan, Bind::where_fits, env);
    CHECK(held->role() == HeldBinding::Role::bound_by_default);
    CHECK(held->claimed() == view.mask);  // one rank: every cpu is its share
    CHECK(claimed_cpus(view.mask, dir) == view.mask);
  }
  CHECK(claimed_cpus(view.mask, dir).empty());
  if (view.mask.size() < 2) {
    MESSAGE("skipped the rest: one cpu, so no other to bind to");
    std::filesystem::remove_all(dir);
    return;
  }
  // Another job claims the first cpu between our look and our claim.
  CpuClaims other;
  REQUIRE(other.claim_all({view.mask.front()}, dir));
  bind_ranks(plan, Bind::where_fits, 1, view);  // the look from before the other's claim
  const auto held = hold_binding(plan, Bind::where_fits, env);
  auto rest = view.mask;
  rest.erase(rest.begin());
  CHECK(held->claimed() == rest);
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{rest});
  // A second job finds none free: unbound, and it says so to the bound ones (UnboundMark).
  LaunchPlan second;
  second.local_count = 1;
  bind_ranks(second, Bind::where_fits, 1, cpu_view(env));
  CHECK(second.cpu_shares.empty());
  const auto unbound = hold_binding(second, Bind::where_fits, env);
  CHECK(unbound->role() == HeldBinding::Role::unbound_for_want);
  CHECK(unbound->marked());
  CHECK(unbound->notice().raised());
  CHECK(others_run_unbound(dir));
  // --no-bind finds the same: its ranks share the claimed cpus, and it says so too.
  LaunchPlan unbinding;
  unbinding.local_count = 1;
  bind_ranks(unbinding, Bind::never, 1, cpu_view(env));
  CHECK(unbinding.binding.find("wait yielding") != std::string::npos);
  CHECK(hold_binding(unbinding, Bind::never, env)->role() == HeldBinding::Role::unbound_for_want);
  // --bind onto cpus another job claimed: bound all the same, marked, its ranks told.
  LaunchPlan forced;
  forced.local_count = 1;
  bind_ranks(forced, Bind::always, 1, cpu_view(env));
  const auto over = hold_binding(forced, Bind::always, env);
  CHECK(over->role() == HeldBinding::Role::bound_over_claims);
  CHECK(over->marked());
  CHECK(over->notice().raised());
  CHECK_FALSE(forced.cpu_shares.empty());
  other.release();
  std::filesystem::remove_all(dir);
}

TEST_CASE("not bound by default: more ranks than cpus, or a mask the user or an outer launcher narrowed") {
  LaunchPlan plan;
  bind_ranks(plan, Bind::where_fits, 3, node({0, 1}, 2));
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("3 rank(s) on 2 usable cpu(s)") != std::string::npos);
  // taskset -c 0 idist-run -n 1, srun --cpu-bind: the mask is narrower than the machine.
  bind_ranks(plan, Bind::where_fits, 1, node({0}, 2));
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("narrower than the online cpus") != std::string::npos);
  bind_ranks(plan, Bind::where_fits, 2, node({2, 3, 4, 5}, 8));
  CHECK(plan.cpu_shares.empty());
  // --no-bind: never.
  bind_ranks(plan, Bind::never, 2, node({0, 1}, 2));
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.starts_with("not bound: --no-bind"));
}

TEST_CASE("--bind binds whatever the mask and count: within a narrowed mask, and ranks sharing cpus") {
  LaunchPlan plan;
  bind_ranks(plan, Bind::always, 2, node({2, 3, 4, 5}, 8));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{2, 3}, {4, 5}});
  bind_ranks(plan, Bind::always, 3, node({0, 1}, 2));
  CHECK(plan.cpu_shares == std::vector<std::vector<int>>{{0}, {1}, {0}});
  CHECK(plan.binding.find("some share a cpu") != std::string::npos);
}

TEST_CASE("make_plan binds spawned ranks, says so in --dry-run, and leaves exec mode to the outer launcher") {
  const auto mask = usable_cpus();
  const auto allotted = allotted_cpus().cpus;
  const bool whole = std::all_of(allotted.begin(), allotted.end(),
                                 [&](int c) { return std::binary_search(mask.begin(), mask.end(), c); });
  auto o = options(static_cast<int>(mask.size()));
  auto plan = make_plan(o, from({}));
  CHECK(plan.cpu_shares.empty() == !whole);
  auto json = nlohmann::json::parse(dry_run_json(plan));
  CHECK(json["binding"]["bound"] == whole);
  CHECK(json["binding"]["why"] == plan.binding);
  CHECK(json["binding"]["cpus"].size() == plan.cpu_shares.size());
  // One rank per cpu and one more: not bound.
  plan = make_plan(options(static_cast<int>(mask.size()) + 1), from({}));
  CHECK(plan.cpu_shares.empty());
  o.bind = Bind::never;
  CHECK(make_plan(o, from({})).cpu_shares.empty());
  // A rank per task of an outer launcher, exec'd in place.
  plan = make_plan(options(), from(kSrunCyclicTask1));
  REQUIRE(plan.mode == Mode::exec);
  CHECK(plan.cpu_shares.empty());
  CHECK(plan.binding.find("outer launcher") != std::string::npos);
}
