// Launch plans (test_plan, continued): uneven layouts and edge cases: refusals, --local-rank-arg,
// a program's MPI libraries, and each restart's attempt.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "idist/launchers/plan.hpp"
#include "idist/launchers/program.hpp"
#include "launcher_envs.hpp"
#include "plan_helpers.hpp"

using namespace idist;
using namespace idist::launchers;
using namespace test;

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

TEST_CASE("an outer job's flight recorder descriptor reaches a rank we exec, not one we spawn") {
  const std::vector<std::string> outer = {"IDIST_RECORDER_FD=5"};
  const auto spawned = environment_of(make_plan(options(2), from({})), 0, outer);
  CHECK_FALSE(spawned.contains("IDIST_RECORDER_FD"));
  const auto plan = make_plan(options(), from(kTorchrunRank1));
  REQUIRE(plan.mode == Mode::exec);
  const auto execd = environment_of(plan, 0, outer);
  CHECK(execd.at("IDIST_RECORDER_FD") == "5");
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
