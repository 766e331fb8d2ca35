#pragma once
// What test_plan's files share: the options a command line gives, make_plan's usage error, a
// look through a plan's notes, and the environment a rank of a plan gets.

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idist/launchers/plan.hpp"
#include "idist/launchers/program.hpp"
#include "launcher_envs.hpp"

namespace test {

// Options as the command line gives them; dry run, so that no test reserves a port by accident.
inline idist::launchers::LaunchOptions options(std::optional<int> nproc = std::nullopt) {
  idist::launchers::LaunchOptions o;
  o.nproc_per_node = nproc;
  o.dry_run = true;
  o.command = {"/bin/true"};
  o.pmi = fake_pmi;
  return o;
}

// The UsageError's message, or "no error".
inline std::string usage_error(const idist::launchers::LaunchOptions& o, const Env& vars = {}) {
  try {
    idist::launchers::make_plan(o, from(vars));
  } catch (const idist::launchers::UsageError& e) {
    return e.what();
  }
  return "no error";
}

inline bool any_note(const idist::launchers::LaunchPlan& plan, std::string_view part) {
  return std::any_of(plan.notes.begin(), plan.notes.end(), [&](const auto& n) { return contains(n, part); });
}

// rank_environment's output as a map, for lookups.
inline std::map<std::string, std::string> environment_of(const idist::launchers::LaunchPlan& plan, int index,
                                                         std::vector<std::string> base) {
  std::vector<char*> environ_like;
  for (auto& entry : base) environ_like.push_back(entry.data());
  environ_like.push_back(nullptr);
  std::map<std::string, std::string> out;
  for (const auto& entry : idist::launchers::rank_environment(plan, index, environ_like.data())) {
    const auto eq = entry.find('=');
    REQUIRE(eq != std::string::npos);
    out[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return out;
}

}  // namespace test
