#pragma once
// Forwards one rank's stdout or stderr to ours a whole line at a time, so that lines of
// different ranks never interleave mid-line: the console queues and writes whole lines
// (idist-run is the only writer, single-threaded).

#include <string>
#include <string_view>

#include "console.hpp"

namespace idist::launchers {

class LineForwarder {
 public:
  LineForwarder(detail::Console& console, detail::Channel channel, std::string prefix)
      : console_(console), channel_(channel), prefix_(std::move(prefix)) {}

  // Writes every complete line in data, and a line's redrawn part up to its last '\r' (a
  // progress bar); keeps the rest for the next call.
  void feed(const char* data, std::size_t size);
  // At end of stream: writes what is left, so the last partial line is not lost. It gets a
  // newline so that the next line (another rank's, or our summary) starts on its own.
  void finish();

  // A line longer than this is written in pieces rather than held in memory.
  static constexpr std::size_t kMaxLine = 1 << 20;

 private:
  void emit(std::string_view line);

  detail::Console& console_;
  detail::Channel channel_;
  std::string prefix_;
  std::string pending_;
};

}  // namespace idist::launchers
