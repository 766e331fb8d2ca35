#pragma once
// idist-run's own messages, set up once by a caller of supervise() (idist-run, idist::spawn).
// Implemented beside the console whose queue they join (src/output/console.cpp).

#include <string>

namespace idist::launchers {

// idist-run's own messages: spdlog's default logger, "<name>: message" on stderr. While
// supervise() runs they take the ranks' stderr lines' way (queued in order with them, never
// blocking on a stalled console); before and after, they are written at once.
void setup_logging(const std::string& name, bool verbose);

}  // namespace idist::launchers
