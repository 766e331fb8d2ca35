#include "idist/launchers/exec.hpp"

#include "idist/launchers/program.hpp"

#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace idist::launchers {

void exec_in_place(const LaunchPlan& plan, const std::string& path, char** base_environ) {
  auto env = rank_environment(plan, 0, base_environ);
  std::vector<char*> envp;
  for (auto& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = rank_command(plan, 0);
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  ::execve(path.c_str(), argv.data(), envp.data());
  const auto failure = exec_failure(path, errno);
  throw ExecError("cannot execute " + path + ": " + failure.why, failure.code);
}

}  // namespace idist::launchers
