#pragma once
// --forward-signals as idist-run reads it (src/supervise/signal_list.cpp, beside the table of
// the signals the supervisor handles).

#include <string_view>
#include <vector>

namespace idist::launchers {

// Parses "USR1,USR2" (with or without SIG, any case; "none" for no signal) into signal
// numbers; throws std::invalid_argument naming the bad entry and the choices.
std::vector<int> parse_signal_list(std::string_view text);

}  // namespace idist::launchers
