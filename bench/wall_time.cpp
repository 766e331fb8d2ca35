// wall_time: runs a command several times and prints its wall time as JSON (median, min,
// max, every run), for the launch-cost comparison of scripts/bench.sh.
//
//   wall_time -r 20 -- idist-run -n 1 /bin/true
//   {"command": "idist-run -n 1 /bin/true", "reps": 20, "median_ms": 3.1, "min_ms": 2.9, ...}
//
// The loop is C++ (posix_spawn, waitpid) rather than a shell's, so that what is timed is the
// command and not the shell's fork: a millisecond of bash would hide differences of that order.
// The command's output goes to /dev/null (--show-output keeps it). Exits 1 when a run fails.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <cstring>
#include <vector>

extern char** environ;

namespace {

// One run: its wall time in milliseconds, or its failure.
double run_once(const std::vector<std::string>& command, bool show_output, int& status) {
  std::vector<char*> argv;
  for (const auto& word : command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!show_output) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int error = ::posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) throw std::runtime_error("cannot start " + command.front() + ": " + std::strerror(error));
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  int warmup = 1;
  bool show_output = false;
  CLI::App app("Runs a command several times and prints its wall time as JSON", "wall_time");
  app.add_option("-r,--reps", reps, "Timed runs")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("-w,--warmup", warmup, "Untimed runs first (page cache, dynamic linker)")
      ->check(CLI::Range(0, 1000))->capture_default_str();
  app.add_flag("--show-output", show_output, "Let the command's output through");
  app.prefix_command();
  std::vector<std::string> command;
  try {
    app.parse(argc, argv);
    command = app.remaining();
    if (!command.empty() && command.front() == "--") command.erase(command.begin());
    if (command.empty()) throw CLI::ValidationError("no command given (wall_time [OPTIONS] -- COMMAND [ARGS...])");
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "wall_time: error: " << e.what() << "\n";
    return 2;
  }

  try {
    std::vector<double> runs;
    for (int i = 0; i < warmup + reps; ++i) {
      int status = 0;
      const double ms = run_once(command, show_output, status);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::cerr << "wall_time: run " << i + 1 << " of '" << command.front() << "' failed: " << describe(status) << "\n";
        return 1;
      }
      if (i >= warmup) runs.push_back(ms);
    }
    auto sorted = runs;
    std::sort(sorted.begin(), sorted.end());
    const auto n = sorted.size();
    const double median = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    std::string joined;
    for (const auto& word : command) {
      if (!joined.empty()) joined += ' ';
      joined += word;
    }
    const nlohmann::json out = {{"command", joined},      {"reps", reps},           {"median_ms", median},
                                {"min_ms", sorted.front()}, {"max_ms", sorted.back()}, {"runs_ms", runs}};
    std::cout << out.dump() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "wall_time: " << e.what() << "\n";
    return 1;
  }
}
