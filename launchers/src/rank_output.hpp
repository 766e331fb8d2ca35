#pragma once
// Where one rank's stdout or stderr goes: the console (whole lines, see LineForwarder), the
// rank's log file under --log-dir (every byte as written, untagged), and for stderr a short
// tail kept for the failure summary.

#include <string>
#include <string_view>
#include <vector>

#include "line_forwarder.hpp"

namespace idist::launchers::detail {

// The last few KiB of a stream: enough for the last lines of a failing rank's stderr without
// keeping megabytes of a chatty one.
class OutputTail {
 public:
  void feed(std::string_view data);
  // The last `max_lines` non-empty lines, each cut to `max_width` characters.
  std::vector<std::string> last_lines(std::size_t max_lines, std::size_t max_width = 300) const;

  static constexpr std::size_t kKeep = 8 * 1024;

 private:
  std::string kept_;
};

class RankOutput {
 public:
  // log_fd < 0: no file. The file is closed at destruction.
  RankOutput(int console_fd, std::string prefix, int log_fd, bool keep_tail)
      : console_(console_fd, std::move(prefix)), log_fd_(log_fd), keep_tail_(keep_tail) {}
  ~RankOutput();
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  void feed(const char* data, std::size_t size);
  // End of stream: the console gets the last partial line (with a newline added); the file
  // already has every byte, and is closed.
  void finish();
  const OutputTail& tail() const { return tail_; }

 private:
  LineForwarder console_;
  int log_fd_;
  bool keep_tail_;
  OutputTail tail_;
};

}  // namespace idist::launchers::detail
