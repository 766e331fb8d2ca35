#pragma once
// One way to print a duration in a message: seconds, as short as exact ("300s", "2.5s",
// "0.05s"), so that a timeout reads the same from the store, the runtime and every backend.

#include <chrono>
#include <cstdio>
#include <string>

namespace idist::detail {

inline std::string duration_text(std::chrono::duration<double> t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%gs", t.count());
  return text;
}

}  // namespace idist::detail
