#pragma once
// The library's own logger. Warnings (a stranger refused by the store, a finalize that did not
// see every rank) go to stderr: a rank's stdout belongs to the program (results, CSV, JSON),
// and spdlog's default logger writes to stdout. Not registered in spdlog's registry, so a
// program's own loggers, levels and drop_all() neither clash with it nor silence it.
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

namespace idist::detail {

// Where the logger writes: stderr. A dist_sink, so that tests can swap in a capture sink
// while server threads are logging.
inline spdlog::sinks::dist_sink_mt& log_sinks() {
  static const auto sinks = std::make_shared<spdlog::sinks::dist_sink_mt>(
      std::vector<spdlog::sink_ptr>{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()});
  return *sinks;
}

// Nameless: the messages already say "idist store: ..." or "[idist rank r/n] ...".
inline spdlog::logger& log() {
  static const auto logger = std::make_shared<spdlog::logger>(
      "", std::shared_ptr<spdlog::sinks::dist_sink_mt>(std::shared_ptr<void>(), &log_sinks()));
  return *logger;
}

}  // namespace idist::detail
