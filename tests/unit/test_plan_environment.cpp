// Launch plans (test_plan, continued): --dry-run's JSON, and the environment each rank gets.
#include <doctest/doctest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "idist/launchers/plan.hpp"
#include "launcher_envs.hpp"
#include "plan_helpers.hpp"

using namespace idist;
using namespace idist::launchers;
using namespace test;

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
