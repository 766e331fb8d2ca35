#pragma once
// Prints values the way the Python tutorial shows them: [9, 12], [0.0, 2.0, 4.0].

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace examples {

template <class T>
std::string repr(T value) {
  std::ostringstream out;
  if constexpr (std::is_floating_point_v<T>) {
    out << value;
    if (std::isfinite(value) && value == std::floor(value)) out << ".0";  // Python prints 2.0, not 2
  } else {
    out << +value;
  }
  return out.str();
}

template <class T>
std::string repr(const std::vector<T>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + repr(values[i]);
  return out + "]";
}

// One line per call, written at once, so lines of different ranks do not mix.
inline void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace examples
