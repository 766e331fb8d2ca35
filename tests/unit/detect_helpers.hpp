#pragma once
// What test_detect's files share: detect() over a recorded env with the fake PMI server, its
// error's message, and a look through its notes.

#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "idist/launchers/detect.hpp"
#include "launcher_envs.hpp"

namespace test {

inline idist::launchers::Detected detected(const Env& vars, std::string_view launcher = "auto") {
  auto d = idist::launchers::detect(from(vars), {.launcher = launcher, .pmi = fake_pmi});
  REQUIRE(d.found);
  return *d.found;
}

// The DetectError's message, or "no error" (so a CHECK on it shows what was thrown).
inline std::string detect_error(const Env& vars, std::string_view launcher = "auto") {
  try {
    idist::launchers::detect(from(vars), {.launcher = launcher, .pmi = fake_pmi});
  } catch (const idist::launchers::DetectError& e) {
    return e.what();
  }
  return "no error";
}

inline bool any_note(const idist::launchers::Detection& d, std::string_view part) {
  for (const auto& note : d.notes)
    if (contains(note, part)) return true;
  return false;
}

}  // namespace test
