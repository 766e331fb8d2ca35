#include <doctest/doctest.h>

#include <map>

#include "idist/env_contract.hpp"

using namespace idist;

namespace {

env::Lookup from(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(std::map<std::string, std::string> vars) {
  try {
    env::read_contract(from(std::move(vars)));
  } catch (const env::ContractError& e) {
    return e.what();
  }
  return "no error";
}

const std::map<std::string, std::string> kValid = {{"RANK", "2"},        {"WORLD_SIZE", "4"},
                                                   {"LOCAL_RANK", "0"},  {"LOCAL_WORLD_SIZE", "2"},
                                                   {"NODE_RANK", "1"},   {"MASTER_ADDR", "10.0.0.1"},
                                                   {"MASTER_PORT", "29500"}};

std::map<std::string, std::string> valid_with(std::string name, std::optional<std::string> value) {
  auto vars = kValid;
  if (value) {
    vars[name] = *value;
  } else {
    vars.erase(name);
  }
  return vars;
}

}  // namespace

TEST_CASE("no variables: a world of one") {
  const auto c = env::read_contract(from({}));
  CHECK_FALSE(c.from_env);
  CHECK(c.rank == 0);
  CHECK(c.world_size == 1);
  CHECK(c.local_world_size == 1);
  CHECK(c.nnodes == 1);
  CHECK(c.timeout == env::kDefaultTimeout);
}

TEST_CASE("a full contract is read as given") {
  auto vars = kValid;
  vars["IDIST_BACKEND"] = "gloo";
  vars["IDIST_JOB_TOKEN"] = "secret";
  vars["IDIST_TIMEOUT"] = "1.5";
  vars["IDIST_RESTART_COUNT"] = "2";
  const auto c = env::read_contract(from(vars));
  CHECK(c.from_env);
  CHECK(c.rank == 2);
  CHECK(c.world_size == 4);
  CHECK(c.local_rank == 0);
  CHECK(c.local_world_size == 2);
  CHECK(c.node_rank == 1);
  CHECK(c.nnodes == 2);
  CHECK(c.master_addr == "10.0.0.1");
  CHECK(c.master_port == 29500);
  CHECK(c.backend == "gloo");
  CHECK(c.job_token == "secret");
  CHECK(c.timeout == std::chrono::milliseconds(1500));
  CHECK(c.restart_count == 2);
}

TEST_CASE("torch's minimum (RANK, WORLD_SIZE, MASTER_*) means one node") {
  const auto c = env::read_contract(
      from({{"RANK", "1"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", "1234"}}));
  CHECK(c.local_rank == 1);
  CHECK(c.local_world_size == 3);
  CHECK(c.nnodes == 1);
  CHECK(c.node_rank == 0);
}

TEST_CASE("GROUP_RANK is torchrun's NODE_RANK; the two must agree") {
  auto vars = valid_with("NODE_RANK", std::nullopt);
  vars["GROUP_RANK"] = "1";
  CHECK(env::read_contract(from(vars)).node_rank == 1);
  vars["NODE_RANK"] = "0";
  CHECK(error_of(vars) == "NODE_RANK=0 and GROUP_RANK=1 disagree");
}

TEST_CASE("every bad value is an error naming the variable and the value") {
  CHECK(error_of(valid_with("RANK", "abc")) == "RANK='abc': not an integer");
  CHECK(error_of(valid_with("RANK", "")) == "RANK='': not an integer");
  CHECK(error_of(valid_with("RANK", " 1")) == "RANK=' 1': not an integer");
  CHECK(error_of(valid_with("RANK", "1x")) == "RANK='1x': not an integer");
  CHECK(error_of(valid_with("RANK", "4")) == "RANK='4': must be between 0 and 3");
  CHECK(error_of(valid_with("RANK", "-1")) == "RANK='-1': must be between 0 and 3");
  CHECK(error_of(valid_with("WORLD_SIZE", "0")) == "WORLD_SIZE='0': must be between 1 and 16777216");
  CHECK(error_of(valid_with("WORLD_SIZE", "99999999999")) == "WORLD_SIZE='99999999999': must be between 1 and 16777216");
  CHECK(error_of(valid_with("LOCAL_RANK", "2")) == "LOCAL_RANK='2': must be less than LOCAL_WORLD_SIZE=2");
  CHECK(error_of(valid_with("LOCAL_WORLD_SIZE", "5")) == "LOCAL_WORLD_SIZE='5': must be between 1 and 4");
  CHECK(error_of(valid_with("NODE_RANK", "2")) == "NODE_RANK='2': must be less than the node count 2");
  CHECK(error_of(valid_with("MASTER_PORT", "0")) == "MASTER_PORT='0': must be between 1 and 65535");
  CHECK(error_of(valid_with("MASTER_PORT", "65536")) == "MASTER_PORT='65536': must be between 1 and 65535");
  CHECK(error_of(valid_with("MASTER_PORT", "http")) == "MASTER_PORT='http': not an integer");
  CHECK(error_of(valid_with("MASTER_ADDR", "")) == "MASTER_ADDR='': empty host name");
  CHECK(error_of(valid_with("IDIST_BACKEND", "tpu")) == "IDIST_BACKEND='tpu': expected gloo, nccl or mpi");
  CHECK(error_of(valid_with("IDIST_TIMEOUT", "soon")) == "IDIST_TIMEOUT='soon': not a number of seconds");
  CHECK(error_of(valid_with("IDIST_TIMEOUT", "0")) == "IDIST_TIMEOUT='0': must be more than 0 and at most 30 days");
  CHECK(error_of(valid_with("IDIST_TIMEOUT", "nan")) == "IDIST_TIMEOUT='nan': not a number of seconds");
}

TEST_CASE("missing variables are named") {
  CHECK(error_of(valid_with("WORLD_SIZE", std::nullopt)) == "WORLD_SIZE is not set (needed with RANK)");
  CHECK(error_of(valid_with("RANK", std::nullopt)) == "RANK is not set (needed with WORLD_SIZE)");
  CHECK(error_of(valid_with("MASTER_ADDR", std::nullopt)) ==
        "MASTER_ADDR is not set (rank 0's host is needed when WORLD_SIZE > 1)");
  CHECK(error_of(valid_with("MASTER_PORT", std::nullopt)) ==
        "MASTER_PORT is not set (rank 0's port is needed when WORLD_SIZE > 1)");
  // A lone MASTER_ADDR (left over in a shell) still needs RANK and WORLD_SIZE.
  CHECK(error_of({{"MASTER_ADDR", "x"}}) == "WORLD_SIZE is not set (needed with RANK)");
}

TEST_CASE("a world of one needs no store address") {
  const auto c = env::read_contract(from({{"RANK", "0"}, {"WORLD_SIZE", "1"}}));
  CHECK(c.from_env);
  CHECK(c.world_size == 1);
  CHECK(c.master_port == 0);
}

TEST_CASE("to_variables round-trips through read_contract") {
  env::Contract c;
  c.rank = 5;
  c.world_size = 8;
  c.local_rank = 1;
  c.local_world_size = 4;
  c.node_rank = 1;
  c.nnodes = 2;
  c.master_addr = "node0";
  c.master_port = 4242;
  c.backend = "gloo";
  c.job_token = "t0k";
  c.run_id = "abc";
  c.launcher = "spawn";
  std::map<std::string, std::string> vars;
  for (auto& [k, v] : env::to_variables(c)) vars[k] = v;
  CHECK(vars.count("IDIST_TIMEOUT") == 0);  // the default: what the rank inherits stands
  c.timeout = std::chrono::milliseconds(2500);
  for (auto& [k, v] : env::to_variables(c)) vars[k] = v;
  CHECK(vars.at("IDIST_TIMEOUT") == "2.500");
  CHECK(env::read_contract(from(vars)).timeout == std::chrono::milliseconds(2500));
  CHECK(vars.at("GROUP_RANK") == "1");
  CHECK(vars.at("GROUP_WORLD_SIZE") == "2");
  const auto back = env::read_contract(from(vars));
  CHECK(back.rank == 5);
  CHECK(back.world_size == 8);
  CHECK(back.local_rank == 1);
  CHECK(back.local_world_size == 4);
  CHECK(back.node_rank == 1);
  CHECK(back.nnodes == 2);
  CHECK(back.master_addr == "node0");
  CHECK(back.master_port == 4242);
  CHECK(back.backend == "gloo");
  CHECK(back.job_token == "t0k");
  CHECK(back.run_id == "abc");
  CHECK(back.launcher == "spawn");
}

TEST_CASE("an outer launcher's marks without a topology are remembered, so init() can refuse a world of one") {
  // mpiexec -n 3 ./prog, no idist-run: nothing of the contract, but PMI_SIZE says 3.
  auto c = env::read_contract(from({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"PMI_FD", "6"}}));
  CHECK_FALSE(c.from_env);
  CHECK(c.unread_launcher.find("PMI_RANK=1") != std::string::npos);
  // A size the launcher keeps to itself (-pmi-port) counts as a job too.
  CHECK_FALSE(env::read_contract(from({{"PMI_ID", "0"}, {"PMI_PORT", "h:1"}})).unread_launcher.empty());
  // One task is a world of one, rightly; so is an sbatch script (no step) and plain config.
  CHECK(env::read_contract(from({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"PMIX_RANK", "0"}}))
            .unread_launcher.empty());
  CHECK(env::read_contract(from({{"SLURM_JOB_ID", "5"}, {"SLURM_NTASKS", "4"}, {"SLURM_PROCID", "0"}})).unread_launcher.empty());
  CHECK(env::read_contract(from({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}})).unread_launcher.empty());
  CHECK(env::read_contract(from({{"OMPI_MCA_btl", "self"}})).unread_launcher.empty());
  // With the contract set (idist-run did its job), the marks do not matter.
  CHECK(env::read_contract(from({{"PMI_SIZE", "3"}, {"PMI_RANK", "1"}, {"RANK", "1"}, {"WORLD_SIZE", "3"},
                                 {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1234"}}))
            .unread_launcher.empty());
}

TEST_CASE("IDIST_INTRANODE: auto by default, auto/shm/off, anything else one error naming it") {
  CHECK(env::read_contract(from({})).intranode == "auto");
  for (const char* mode : {"auto", "shm", "off"}) CHECK(env::read_contract(from({{"IDIST_INTRANODE", mode}})).intranode == mode);
  CHECK_THROWS_WITH_AS(env::read_contract(from({{"IDIST_INTRANODE", "fast"}})),
                       "IDIST_INTRANODE='fast': expected auto, shm or off", env::ContractError);
}

TEST_CASE("IDIST_INTERHOST: auto by default, auto/ucx/gloo, anything else one error naming it") {
  CHECK(env::read_contract(from({})).interhost == "auto");
  for (const char* mode : {"auto", "ucx", "gloo"}) CHECK(env::read_contract(from({{"IDIST_INTERHOST", mode}})).interhost == mode);
  CHECK_THROWS_WITH_AS(env::read_contract(from({{"IDIST_INTERHOST", "rdma"}})),
                       "IDIST_INTERHOST='rdma': expected auto, ucx or gloo", env::ContractError);
}

TEST_CASE("IDIST_CPUS_SHARED: auto by default, auto or a yes/no") {
  CHECK(env::read_contract(from({})).cpus_shared == "auto");
  CHECK(env::read_contract(from({{"IDIST_CPUS_SHARED", "auto"}})).cpus_shared == "auto");
  CHECK(env::read_contract(from({{"IDIST_CPUS_SHARED", "AUTO"}})).cpus_shared == "auto");
  CHECK(env::read_contract(from({{"IDIST_CPUS_SHARED", ""}})).cpus_shared == "auto");
  CHECK(env::read_contract(from({{"IDIST_CPUS_SHARED", "yes"}})).cpus_shared == "1");
  CHECK(env::read_contract(from({{"IDIST_CPUS_SHARED", "0"}})).cpus_shared == "0");
  CHECK_THROWS_WITH_AS(env::read_contract(from({{"IDIST_CPUS_SHARED", "sometimes"}})),
                       "IDIST_CPUS_SHARED='sometimes': expected auto, 1 or 0", env::ContractError);
}

TEST_CASE("every yes/no variable reads alike: 1/true/yes, 0/false/no, any case; else one error naming it") {
  for (const char* yes : {"1", "true", "yes", "YES", "True"}) {
    CAPTURE(yes);
    CHECK(env::read_contract(from({{"IDIST_DEBUG", yes}})).debug);
    CHECK(env::read_contract(from({{"IDIST_STORE_BIND_ALL", yes}})).store_bind_all);
  }
  for (const char* no : {"", "0", "false", "no", "NO"}) {
    CAPTURE(no);
    CHECK_FALSE(env::read_contract(from({{"IDIST_DEBUG", no}})).debug);
  }
  CHECK_THROWS_WITH_AS(env::read_contract(from({{"IDIST_DEBUG", "maybe"}})),
                       "IDIST_DEBUG='maybe': expected 1 or 0 (also true/false, yes/no)", env::ContractError);
}

TEST_CASE("the tuning thresholds: byte counts, off for IDIST_UCX_TCP_FROM, empty as unset; else one error naming it") {
  const auto none = env::read_contract(from({})).tuning;
  CHECK_FALSE(none.ucx_ring_from);
  CHECK_FALSE(none.ucx_tcp_from);
  CHECK_FALSE(none.hier_segment);
  CHECK_FALSE(none.hier_rails_from);
  const auto given = env::read_contract(from({{"IDIST_UCX_RING_FROM", "4096"},
                                              {"IDIST_UCX_TCP_FROM", "off"},
                                              {"IDIST_HIER_SEGMENT", "0"},
                                              {"IDIST_HIER_RAILS_FROM", ""}}))
                         .tuning;
  CHECK(given.ucx_ring_from == std::size_t{4096});
  CHECK(given.ucx_tcp_from == env::Contract::Tuning::kNever);
  CHECK(given.hier_segment == std::size_t{0});
  CHECK_FALSE(given.hier_rails_from);
  CHECK(env::read_contract(from({{"IDIST_UCX_TCP_FROM", "1"}})).tuning.ucx_tcp_from == std::size_t{1});
  CHECK(error_of({{"IDIST_HIER_SEGMENT", "1M"}}) == "IDIST_HIER_SEGMENT='1M': not a byte count (a whole number, as 1048576)");
  CHECK(error_of({{"IDIST_HIER_RAILS_FROM", "off"}}) ==
        "IDIST_HIER_RAILS_FROM='off': not a byte count (a whole number, as 1048576)");
  CHECK(error_of({{"IDIST_UCX_RING_FROM", "-1"}}) == "IDIST_UCX_RING_FROM='-1': not a byte count (a whole number, as 1048576)");
  CHECK(error_of({{"IDIST_UCX_TCP_FROM", "64k"}}) ==
        "IDIST_UCX_TCP_FROM='64k': not a byte count (a whole number, as 65536) or off");
  CHECK(error_of({{"IDIST_UCX_RING_FROM", "99999999999999999999999"}}) ==
        "IDIST_UCX_RING_FROM='99999999999999999999999': not a byte count (a whole number, as 1048576)");
}

TEST_CASE("IDIST_REPLACEMENT: ORIGIN@G beside IDIST_RECOVERY_STORE, anything else one error naming it") {
  const std::map<std::string, std::string> store{{"IDIST_RECOVERY_STORE", "127.0.0.1:4000"}};
  auto with = [&](std::string value) {
    auto vars = store;
    vars["IDIST_REPLACEMENT"] = std::move(value);
    return from(vars);
  };
  CHECK(env::read_contract(from(store)).replacement_origin == -1);
  const auto c = env::read_contract(with("4@1"));
  CHECK(c.replacement_origin == 4);
  CHECK(c.replacement_after == 1);
  for (const char* bad : {"4", "@1", "4@", "x@1", "4@1x", "-1@2"})
    CHECK_THROWS_WITH_AS(
        env::read_contract(with(bad)),
        ("IDIST_REPLACEMENT='" + std::string(bad) + "': expected ORIGIN@GENERATION (idist-run sets it)").c_str(),
        env::ContractError);
  CHECK_THROWS_WITH_AS(env::read_contract(from({{"IDIST_REPLACEMENT", "4@1"}})),
                       "IDIST_REPLACEMENT='4@1': a replacement needs IDIST_RECOVERY_STORE (idist-run sets both)",
                       env::ContractError);
}
