// idist-run's settings from IDIST_* variables and a JSON config file: the names (none may take
// a name the env contract already gives ranks), the file's checks, and --dry-run's additions.
// The command line's own checks on the values run in idist-run (tests/e2e/config.sh).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "idist/launchers/config.hpp"
#include "idist/launchers/etcd_rendezvous.hpp"
#include "idist/launchers/program.hpp"
#include "idist/launchers/rendezvous.hpp"
#include "launcher_envs.hpp"

using namespace idist;
using namespace idist::launchers;
namespace config = idist::launchers::config;

namespace {

// A config file holding `text`, removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(std::string_view text) {
    path_ = (std::filesystem::temp_directory_path() / ("idist-test-config-" + std::to_string(::getpid()) + ".json"))
                .string();
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// read_file's UsageError for `text`, less the file's name; "no error" when it reads.
std::string file_error(std::string_view text) {
  TempFile file(text);
  try {
    config::read_file(file.path(), "--config 'x'");
  } catch (const UsageError& e) {
    std::string message = e.what();
    if (message.starts_with(file.path())) message.erase(0, file.path().size());
    return message;
  }
  return "no error";
}

const config::Setting& setting(std::string_view key) {
  return *std::find_if(std::begin(config::kSettings), std::end(config::kSettings),
                       [&](const config::Setting& s) { return s.key == key; });
}

}  // namespace

TEST_CASE("every setting's names follow one rule, and no variable means something else to a rank") {
  const std::set<std::string_view> contract = {env::kRank,          env::kWorldSize,     env::kLocalRank,
                                               env::kLocalWorldSize, env::kNodeRank,      env::kGroupRank,
                                               env::kGroupWorldSize, env::kMasterAddr,    env::kMasterPort,
                                               env::kLauncher,       env::kRunId,         env::kRestartCount,
                                               env::kJobToken,       env::kTimeout,       env::kOmpNumThreads,
                                               env::kStoreBindAll,   env::kDebug,         env::kGlooSocketIfname};
  std::set<std::string_view> variables;
  for (const auto& s : config::kSettings) {
    CAPTURE(s.key);
    std::string dashed(s.key);
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    CHECK(s.option == "--" + dashed);
    CHECK(s.env.starts_with("IDIST_"));
    CHECK_FALSE(contract.contains(s.env));  // IDIST_BACKEND is the exception: the same meaning
    CHECK(variables.insert(s.env).second);
  }
  CHECK(setting("backend").env == env::kBackend);
  CHECK(setting("timeout").env == "IDIST_JOB_TIMEOUT");
  CHECK(setting("launcher").env == "IDIST_LAUNCHER_KIND");
}

TEST_CASE("every setting declares its help, and a flag (boolean) goes into a bool") {
  for (const auto& s : config::kSettings) {
    CAPTURE(s.key);
    CHECK_FALSE(s.help.empty());
    CHECK(std::holds_alternative<bool config::Options::*>(s.target) == (s.type == config::Type::boolean));
    // An integer setting's value is whole: the option takes it as text (count_or_*) or an int.
    if (s.type == config::Type::integer)
      CHECK((std::holds_alternative<int config::Options::*>(s.target) ||
             std::holds_alternative<std::optional<int> config::Options::*>(s.target)));
  }
}

TEST_CASE("from_env: the variable's text, flags as true/false, empty refused") {
  const auto lookup = test::from({{"IDIST_NPROC_PER_NODE", "4"},
                                  {"IDIST_TAG_OUTPUT", "yes"},
                                  {"IDIST_VERBOSE", "0"},
                                  {"IDIST_LOG_DIR", ""},
                                  {"IDIST_DRY_RUN", "maybe"}});
  const auto n = config::from_env(setting("nproc_per_node"), lookup);
  REQUIRE(n);
  CHECK(n->text == "4");
  CHECK(n->from == "IDIST_NPROC_PER_NODE");
  CHECK(n->context == "IDIST_NPROC_PER_NODE='4'");
  CHECK(config::from_env(setting("tag_output"), lookup)->text == "true");
  CHECK(config::from_env(setting("verbose"), lookup)->text == "false");
  CHECK_THROWS_WITH_AS(config::from_env(setting("log_dir"), lookup),
                       "IDIST_LOG_DIR is set but empty: unset it or give a directory", UsageError);
  CHECK_FALSE(config::from_env(setting("grace"), lookup));
  CHECK_THROWS_WITH_AS(config::from_env(setting("dry_run"), lookup), "IDIST_DRY_RUN='maybe': expected 1 or 0 (also true/false, yes/no)",
                       UsageError);
}

TEST_CASE("read_file: values as the command line would take them, program, both spellings") {
  TempFile file(R"({"$schema": "./idist-run.schema.json", "nproc-per-node": 4, "grace": 0.5, "tag_output": false,
                    "master_addr": "node0", "max_restarts": 2.0, "program": ["./train", "--epochs", "10"]})");
  const auto f = config::read_file(file.path(), "--config 'x'");
  CHECK(f.values.at("nproc_per_node").text == "4");
  CHECK(f.values.at("nproc_per_node").from == "nproc-per-node in " + file.path());
  CHECK(f.values.at("nproc_per_node").context == file.path() + ": key 'nproc-per-node'");
  CHECK(f.values.at("grace").text == "0.5");
  CHECK(f.values.at("tag_output").text == "false");
  CHECK(f.values.at("master_addr").text == "node0");
  CHECK(f.values.at("max_restarts").text == "2");  // an integral number is an integer, as in JSON Schema
  CHECK(f.values.size() == 5);
  CHECK(f.program == std::vector<std::string>{"./train", "--epochs", "10"});
}

TEST_CASE("read_file: one line naming the file and the key for every bad file") {
  CHECK(file_error(R"({"nproc_per_node": 2, "bogus": 1})") ==
        ": unknown key 'bogus' (idist-run --print-config-keys lists them)");
  CHECK(file_error(R"({"nnode": 2})") == ": unknown key 'nnode' (did you mean 'nnodes'?)");
  CHECK(file_error(R"({"nproc_per_node": "2"})") == ": key 'nproc_per_node': expected an integer or \"auto\", not string \"2\"");
  CHECK(file_error(R"({"tag_output": [true]})") == ": key 'tag_output': expected true or false, not array [true]");
  CHECK(file_error(R"({"grace": null})") == ": key 'grace': expected a number, not null null");
  CHECK(file_error(R"({"grace": 1, "grace": 2})") == ": key 'grace' is given twice");
  CHECK(file_error(R"({"log-dir": "a", "log_dir": "b"})") == ": keys 'log_dir' and 'log-dir' are the same setting; give one");
  CHECK(file_error(R"({"program": []})") ==
        ": key 'program': expected a non-empty array of strings (the program and its arguments), not array []");
  CHECK(file_error("[1]") == ": expected a JSON object of settings at the top level, not array [1]");
  CHECK(file_error("{\n  \"grace\": 1,\n}") ==
        ": invalid JSON: parse error at line 3, column 1: syntax error while parsing object key - unexpected '}'; "
        "expected string literal");
  CHECK(file_error(R"({"nproc_per_node": 0})") == "no error");  // ranges are the option's to check
  CHECK_THROWS_WITH_AS(config::read_file("/nonexistent/x.json", "--config '/nonexistent/x.json'"),
                       "--config '/nonexistent/x.json': No such file or directory", UsageError);
}

TEST_CASE("read_file: a file nested 100,000 deep gets its one line, not a stack overflow") {
  // Quoting such a value in the error recursed through all of it (SIGSEGV at 100,000; 30,000
  // still fit the stack).
  const auto nested = [](std::size_t depth, std::string_view inner) {
    return std::string(depth, '[') + std::string(inner) + std::string(depth, ']');
  };
  const std::string too_deep = ": arrays or objects nested more than 64 deep; a launch profile is one object of settings";
  CHECK(file_error(nested(100000, "")) == too_deep);
  CHECK(file_error(nested(30000, "")) == too_deep);
  CHECK(file_error("{\"program\": " + nested(99999, "1") + "}") == too_deep);
  // Not closed: the depth is refused before the end is reached.
  CHECK(file_error(std::string(1000000, '[')) == too_deep);
  CHECK(file_error(nested(64, "")) ==
        ": expected a JSON object of settings at the top level, not array " + std::string(37, '[') + "...");
}

TEST_CASE("accepted_keys: both spellings of every setting, program and $schema") {
  const auto keys = config::accepted_keys();
  CHECK(std::is_sorted(keys.begin(), keys.end()));
  for (const auto& s : config::kSettings) {
    std::string dashed(s.key);
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    CHECK(std::count(keys.begin(), keys.end(), std::string(s.key)) == 1);
    CHECK(std::count(keys.begin(), keys.end(), dashed) == 1);
  }
  CHECK(std::count(keys.begin(), keys.end(), "program") == 1);
  CHECK(std::count(keys.begin(), keys.end(), "$schema") == 1);
}

TEST_CASE("help_table names every option, variable and key") {
  const auto table = config::help_table();
  for (const auto& s : config::kSettings) {
    CHECK(test::contains(table, s.option));
    CHECK(test::contains(table, s.env));
    CHECK(test::contains(table, s.key));
  }
  CHECK(test::contains(table, "IDIST_CONFIG"));
}

TEST_CASE("add_settings: typed settings, their origins, and provenance naming them") {
  const std::string plan = R"({"launcher": "spawn", "provenance": {"world_size": "--nnodes x --nproc-per-node",
                               "master_port": "--master-port", "rank": "--node-rank x --nproc-per-node + local index"}})";
  std::vector<config::Resolved> settings = {
      {&setting("nproc_per_node"), "4", "nproc_per_node in job.json"},
      {&setting("nnodes"), "2", "--nnodes"},
      {&setting("master_port"), "29500", "IDIST_MASTER_PORT"},
      {&setting("grace"), "2.5", "default"},
      {&setting("tag_output"), "true", "tag_output in job.json"},
      {&setting("master_addr"), "node0", "--master-addr"},
      {&setting("timeout"), std::nullopt, "default"},
  };
  const auto out = nlohmann::json::parse(config::add_settings(plan, settings, "command line"));
  CHECK(out["settings"] == nlohmann::json::parse(R"({"nproc_per_node": 4, "nnodes": 2, "master_port": 29500,
                                                     "grace": 2.5, "tag_output": true, "master_addr": "node0"})"));
  CHECK(out["settings_from"]["master_port"] == "IDIST_MASTER_PORT");
  CHECK(out["settings_from"]["timeout"] == "default");
  CHECK(out["settings_from"]["program"] == "command line");
  CHECK(out["provenance"]["world_size"] == "--nnodes x nproc_per_node in job.json");
  CHECK(out["provenance"]["master_port"] == "IDIST_MASTER_PORT");
  CHECK(out["provenance"]["rank"] == "--node-rank x nproc_per_node in job.json + local index");
  CHECK(out["launcher"] == "spawn");
}

TEST_CASE("PET_<OPTION>: torchrun's variable for every option torchrun has, after IDIST_*") {
  // torchrun's own spelling of each is on our command line too (the `also` column), so that its
  // PET_ name, torchrun's dest in capitals, is the one a torchrun user knows.
  int torchrun_options = 0;
  for (const auto& s : config::kSettings) {
    const auto pet = config::torchrun_variable(s);
    if (!pet) continue;
    ++torchrun_options;
    std::string dest = std::string(pet->substr(4));
    std::transform(dest.begin(), dest.end(), dest.begin(), [](unsigned char c) { return std::tolower(c); });
    CHECK(dest == s.key);
    const std::string underscored = "--" + dest;
    const bool spelled = s.option == underscored || std::string(s.also).find(underscored) != std::string::npos ||
                         (s.key == "module" && std::string(s.also) == "-m");
    CHECK_MESSAGE(spelled, s.option, " does not take torchrun's spelling ", underscored);
  }
  CHECK(torchrun_options == 13);
  CHECK(config::torchrun_variable(setting("nnodes")) == "PET_NNODES");
  CHECK(config::torchrun_variable(setting("rdzv_id")) == "PET_RDZV_ID");
  CHECK_FALSE(config::torchrun_variable(setting("grace")));

  const auto both = test::from({{"IDIST_NNODES", "3"}, {"PET_NNODES", "2"}, {"PET_MAX_RESTARTS", "4"},
                                {"PET_MODULE", "1"}, {"PET_NPROC_PER_NODE", "cpu"}});
  CHECK(config::from_env(setting("nnodes"), both)->from == "IDIST_NNODES");
  const auto restarts = config::from_env(setting("max_restarts"), both);
  CHECK(restarts->text == "4");
  CHECK(restarts->from == "PET_MAX_RESTARTS");
  CHECK(restarts->context == "PET_MAX_RESTARTS='4'");
  CHECK(config::from_env(setting("module"), both)->text == "true");
  CHECK(std::stoi(config::from_env(setting("nproc_per_node"), both)->text) >= 1);
  CHECK_FALSE(config::from_env(setting("rdzv_conf"), both));
  CHECK_FALSE(config::from_env(setting("grace"), test::from({{"PET_GRACE", "3"}})));
  // Empty is refused, not taken as unset: PET_RDZV_ID='' ran a PyTorchJob's pods with no secret.
  CHECK_THROWS_WITH_AS(config::from_env(setting("rdzv_id"), test::from({{"PET_RDZV_ID", ""}})),
                       "PET_RDZV_ID is set but empty: unset it or give the job's id", UsageError);
  CHECK_THROWS_WITH_AS(config::from_env(setting("rdzv_endpoint"), test::from({{"IDIST_RDZV_ENDPOINT", ""}})),
                       "IDIST_RDZV_ENDPOINT is set but empty: unset it or give HOST[:PORT]", UsageError);
  // A rank torchrun started inherits its PET_*: they are not the options of an idist-run it runs.
  CHECK_FALSE(config::from_env(setting("nnodes"), test::from({{"PET_NNODES", "2"}, {"LOCAL_RANK", "0"}})));
}

TEST_CASE("torchrun's -n values and rendezvous backends, mapped in one place each") {
  CHECK(config::torchrun_nproc_per_node("3", "PET_NPROC_PER_NODE='3'") == 3);
  CHECK(config::torchrun_nproc_per_node("cpu", "x") >= 1);
  CHECK(config::torchrun_nproc_per_node("auto", "x") >= 1);
  CHECK_THROWS_WITH_AS(config::torchrun_nproc_per_node("abc", "PET_NPROC_PER_NODE='abc'"),
                       "PET_NPROC_PER_NODE='abc': not a number of processes (1 to 4096), auto, gpu or cpu", UsageError);
  CHECK_THROWS_WITH_AS(config::torchrun_nproc_per_node("0", "PET_NPROC_PER_NODE='0'"),
                       "PET_NPROC_PER_NODE='0': 0 processes is out of range (1 to 4096)", UsageError);
  CHECK(config::torchrun_rdzv_backend("PET_RDZV_BACKEND", "c10d") == "c10d");
  CHECK(config::torchrun_rdzv_backend("PET_RDZV_BACKEND", "static") == "c10d");
  CHECK(config::torchrun_rdzv_backend("PET_RDZV_BACKEND", "etcd") == "etcd");
  CHECK(config::torchrun_rdzv_backend("PET_RDZV_BACKEND", "etcd-v2") == "etcd");
  CHECK_THROWS_WITH_AS(config::torchrun_rdzv_backend("PET_RDZV_BACKEND", "zk"),
                       "PET_RDZV_BACKEND='zk' is not a rendezvous backend idist-run knows (c10d or static: the "
                       "built-in rendezvous; etcd or etcd-v2: an etcd cluster)",
                       UsageError);
}

TEST_CASE("one rule for an empty value: a variable is to be unset, an option or key left out") {
  CHECK(config::empty_value("PET_RDZV_ID", "the job's id") == "PET_RDZV_ID is set but empty: unset it or give the job's id");
  CHECK(config::empty_value("--rdzv-id", "the job's id") == "--rdzv-id is empty: leave it out or give the job's id");
  CHECK(config::empty_value("--rdzv-conf prefix", "a key prefix") ==
        "--rdzv-conf prefix is empty: leave it out or give a key prefix");
  CHECK_NOTHROW(config::refuse_empty("X", "x", "y"));
}

TEST_CASE("one reading of seconds for every duration: not a number, too small, too large, each said as it is") {
  CHECK(config::parse_seconds("2.5") == 2.5);
  CHECK(config::parse_seconds("1e6") == 1e6);
  CHECK_THROWS_WITH_AS(config::parse_seconds("1e9"), "1e9 is too large: at most 1000000 s", UsageError);
  CHECK_THROWS_WITH_AS(config::parse_seconds("1e999"), "1e999 is too large: at most 1000000 s", UsageError);
  CHECK_THROWS_WITH_AS(config::parse_seconds("inf"), "inf is too large: at most 1000000 s", UsageError);
  CHECK_THROWS_WITH_AS(config::parse_seconds("0"), "0 is too small: above 0 s", UsageError);
  CHECK_THROWS_WITH_AS(config::parse_seconds("1e-999"), "1e-999 is too small: above 0 s", UsageError);
  CHECK_THROWS_WITH_AS(config::parse_seconds("-1", {.min = 0, .min_exclusive = false, .max = 3600}),
                       "-1 is too small: at least 0 s", UsageError);
  CHECK_THROWS_WITH_AS(config::parse_seconds("3601", {.min = 0, .min_exclusive = false, .max = 3600}),
                       "3601 is too large: at most 3600 s", UsageError);
  for (const char* bad : {"abc", "nan", "", "1s", " 1"})
    CHECK_THROWS_WITH_AS(config::parse_seconds(bad), ("'" + std::string(bad) + "' is not a number of seconds").c_str(),
                         UsageError);
}

TEST_CASE("--rdzv-conf: durations through the one reading, etcd's keys, empty values, each error naming its key") {
  RendezvousOptions r;
  EtcdRendezvousOptions etcd;
  config::parse_rdzv_conf("join_timeout=30,heartbeat=0.5,node_timeout=3,prefix=/jobs,local_addr=10.0.0.1", r, &etcd);
  CHECK(r.join_timeout == std::chrono::seconds(30));
  CHECK(r.heartbeat == std::chrono::milliseconds(500));
  CHECK(etcd.prefix == "/jobs/");
  CHECK(etcd.local_addr == "10.0.0.1");
  const auto error = [](const std::string& text, bool with_etcd = true) -> std::string {
    RendezvousOptions r;
    EtcdRendezvousOptions etcd;
    try {
      config::parse_rdzv_conf(text, r, with_etcd ? &etcd : nullptr);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK(error("join_timeout=1e9") == "--rdzv-conf join_timeout=1e9 is too large: at most 1000000 s");
  CHECK(error("node_timeout=abc") == "--rdzv-conf node_timeout='abc' is not a number of seconds");
  CHECK(error("heartbeat=0") == "--rdzv-conf heartbeat=0 is too small: above 0 s");
  CHECK(error("join_timeout=") == "--rdzv-conf join_timeout is empty: leave it out or give a number of seconds");
  CHECK(error("prefix=") == "--rdzv-conf prefix is empty: leave it out or give a key prefix");
  CHECK(error("local_addr=") == "--rdzv-conf local_addr is empty: leave it out or give this node's address");
  CHECK(error("protocol=ftp") == "--rdzv-conf protocol=ftp: protocol is http or https");
  CHECK_NOTHROW(config::parse_rdzv_conf("", r));
  CHECK(doctest::String(error("prefix=x", false).c_str()) ==
        doctest::Contains("--rdzv-conf 'prefix=x': 'prefix' is for --rdzv-backend etcd"));
  CHECK(doctest::String(error("timeout=3").c_str()) == doctest::Contains("--rdzv-conf 'timeout=3': unknown key 'timeout'"));
}
