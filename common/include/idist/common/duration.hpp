#pragma once
// One way to print a duration in a message: seconds, as short as exact ("300s", "2.5s",
// "0.05s"), and one timeout sentence, so that a timeout reads the same from the store, the
// runtime, every backend and idist-run's rendezvous.

#include <algorithm>
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

// Two short measured times side by side, in the unit that shows the smaller to a tenth:
// "120.0 ms against 98.0 ms", "6.2 us against 0.9 us" (a call's work on shared memory).
inline std::string compared_times_text(std::chrono::duration<double, std::milli> t,
                                       std::chrono::duration<double, std::milli> against) {
  const bool micro = std::min(t, against).count() < 0.1;
  const double scale = micro ? 1000.0 : 1.0;
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f %s against %.1f %s", t.count() * scale, micro ? "us" : "ms",
                against.count() * scale, micro ? "us" : "ms");
  return text;
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
