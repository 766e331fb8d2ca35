#pragma once
// One task per rank under an outer launcher: become the program, with the env contract set.
// exec keeps our pid, so the outer launcher's signals and exit-code handling reach the program
// directly, with nothing of ours in between.

#include <string>

#include "idist/launchers/plan.hpp"

namespace idist::launchers {

// Replaces this process with plan.command (at `path`). Returns only by throwing
// std::runtime_error when exec fails.
[[noreturn]] void exec_in_place(const LaunchPlan& plan, const std::string& path, char** base_environ);

}  // namespace idist::launchers
