#pragma once
// Forwards one rank's stdout or stderr to ours, a whole line per write(2), so that lines of
// different ranks never interleave mid-line (idist-run is the only writer, single-threaded).

#include <string>

namespace idist::launchers {

class LineForwarder {
 public:
  LineForwarder(int out_fd, std::string prefix) : out_fd_(out_fd), prefix_(std::move(prefix)) {}

  // Writes every complete line in data; keeps the rest for the next call.
  void feed(const char* data, std::size_t size);
  // At end of stream: writes what is left, so the last partial line is not lost. It gets a
  // newline so that the next line (another rank's, or our summary) starts on its own.
  void finish();

  // A line longer than this is written in pieces rather than held in memory.
  static constexpr std::size_t kMaxLine = 1 << 20;

 private:
  void emit(std::string_view line);

  int out_fd_;
  std::string prefix_;
  std::string pending_;
};

// write(2) until everything is written; gives up silently when the reader is gone (EPIPE):
// a closed console must not kill the supervisor.
void write_all(int fd, std::string_view data);

}  // namespace idist::launchers
