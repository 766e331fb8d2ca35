#pragma once
// One way to print a duration in a message: seconds, as short as exact ("300s", "2.5s",
// "0.05s"), and one timeout sentence, so that a timeout reads the same from the store, the
// runtime, every backend and idist-run's rendezvous.

#include <chrono>
#include <cstdio>
#include <ratio>
#include <string>
#include <string_view>

namespace idist::common {

inline std::string duration_text(std::chrono::duration<double> t) {
  char text[32];
  std::snprintf(text, sizeof(text), "%gs", t.count());
  return text;
}

// A duration measured rather than configured, to a tenth of a second: "2s", not "2.02036s".
inline std::string measured_duration_text(std::chrono::duration<double> t) {
  return duration_text(std::chrono::round<std::chrono::duration<long, std::deci>>(t));
}

// "<what> timed out after <duration>: <why>" (no colon without a why). `what` names the
// operation and its peer; `why` what is known of the cause.
inline std::string timed_out(std::string_view what, std::chrono::duration<double> after, std::string_view why = {}) {
  std::string out(what);
  out += " timed out after " + duration_text(after);
  if (!why.empty()) out.append(": ").append(why);
  return out;
}

}  // namespace idist::common
