// idist-run: start a program as a distributed job.
//
// Parses the command line, asks launchers/ for a plan, and runs it. Everything that decides
// who a rank is lives in launchers/; this file only turns argv into options and errors into
// exit codes (2 for bad usage, as with most Unix tools).

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <iostream>

#include "idist/launchers/program.hpp"
#include "idist/launchers/spawn_plan.hpp"
#include "idist/launchers/supervisor.hpp"

extern char** environ;

namespace {

using idist::launchers::UsageError;

constexpr int kUsageExit = 2;

const char* const kExamples = R"(Examples:
  idist-run -n 4 ./train --epochs 10        4 local ranks; options after the program are its own
  idist-run -n 3 --tag-output ./all_reduce  prefix every output line with [rank N]
  idist-run -n 2 --backend gloo ./train     force the backend the program uses (IDIST_BACKEND)
  idist-run -n 2 -- ./app -n 5              '--' ends idist-run's options explicitly

Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR,
MASTER_PORT, IDIST_JOB_TOKEN and friends, as torch.distributed's env:// expects.
Exit status: 0 when every rank succeeds; else the first failing rank's code (128+signal
when killed by a signal); 128+signal when idist-run itself is interrupted; 2 for bad usage.)";

struct Cli {
  int nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  std::optional<int> master_port;
  std::string backend;
  bool tag_output = false;
  bool verbose = false;
  double grace_seconds = 5;
  std::vector<std::string> command;
};

int parse_nproc(const std::string& text) {
  int value = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != end)
    throw UsageError("--nproc-per-node '" + text + "' is not a number of processes");
  if (ec == std::errc::result_out_of_range || value < 1 || value > 4096)
    throw UsageError("--nproc-per-node " + text + " is out of range (1 to 4096)");
  return value;
}

void setup_logging(bool verbose) {
  auto logger = spdlog::stderr_logger_st("idist-run");
  logger->set_pattern("idist-run: %v");
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

int run(const Cli& cli) {
  idist::launchers::SpawnOptions spawn;
  spawn.nproc_per_node = cli.nproc_per_node;
  spawn.master_addr = cli.master_addr;
  spawn.master_port = cli.master_port;
  spawn.backend = cli.backend;
  spawn.command = cli.command;
  const std::string path = idist::launchers::resolve_program(cli.command.front());

  const auto plan = idist::launchers::make_spawn_plan(spawn);
  spdlog::info("spawn: {} rank(s), MASTER_ADDR={} MASTER_PORT={} run id {}", plan.local_count, plan.job.master_addr,
               plan.job.master_port, plan.job.run_id);

  std::vector<idist::launchers::ProcessSpec> processes;
  for (int local = 0; local < plan.local_count; ++local)
    processes.push_back({plan.first_rank + local, path, plan.command,
                         idist::launchers::rank_environment(plan, local, environ)});

  idist::launchers::SuperviseOptions supervise;
  supervise.tag_output = cli.tag_output;
  supervise.grace = std::chrono::milliseconds(static_cast<long long>(cli.grace_seconds * 1000));
  return idist::launchers::supervise(processes, supervise);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"idist-run: run a program as a distributed job (local ranks over gloo, nccl or mpi)\n"
               "Usage: idist-run [OPTIONS] [--] PROGRAM [ARGS...]",
               "idist-run"};
  app.footer(kExamples);
  app.set_version_flag("--version", std::string("idist-run ") + IDIST_VERSION + " (backends: " + IDIST_BACKENDS + ")");
  Cli cli;
  std::string nproc = "1";
  app.add_option("-n,--nproc-per-node,--nproc_per_node", nproc, "Ranks to start on this node (1 to 4096)")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", cli.master_addr, "Address of rank 0's store")->capture_default_str();
  app.add_option("--master-port,--master_port", cli.master_port, "Port of rank 0's store (default: a free one)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--backend", cli.backend, "Backend every rank uses, overriding the program's choice")
      ->check(CLI::IsMember({"gloo", "nccl", "mpi"}))
      ->envname("IDIST_BACKEND");
  app.add_flag("--tag-output", cli.tag_output, "Prefix each output line with [rank N]");
  app.add_option("--grace", cli.grace_seconds, "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  app.add_flag("-v,--verbose", cli.verbose, "Say what idist-run decides and does");
  // The first word that is not one of our options starts the program's command line.
  app.prefix_command();

  try {
    app.parse(argc, argv);
    cli.command = app.remaining();
    if (!cli.command.empty() && cli.command.front() == "--") cli.command.erase(cli.command.begin());
    if (cli.command.empty()) throw UsageError("no program given (idist-run [OPTIONS] PROGRAM [ARGS...])");
    if (cli.command.front().starts_with("-") && app.remaining().front() != "--")
      throw UsageError("unknown option '" + cli.command.front() + "' (see idist-run --help)");
    cli.nproc_per_node = parse_nproc(nproc);
    setup_logging(cli.verbose);
    return run(cli);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "idist-run: error: " << e.what() << "\n";
    return kUsageExit;
  } catch (const UsageError& e) {
    std::cerr << "idist-run: error: " << e.what() << "\n";
    return kUsageExit;
  } catch (const std::exception& e) {
    std::cerr << "idist-run: error: " << e.what() << "\n";
    return 1;
  }
}
