#pragma once
// One way to print a duration in a message: whole seconds as "300 s", anything else in
// milliseconds ("2500 ms"), so a timeout reads the same from the store, a backend or the runtime.

#include <chrono>
#include <string>

namespace idist::detail {

inline std::string duration_text(std::chrono::milliseconds t) {
  const auto ms = t.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace idist::detail
