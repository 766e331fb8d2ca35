#pragma once
// Where one rank's stdout or stderr goes: the console (whole lines, see LineForwarder), the
// rank's log file under --log-dir (every byte as written, untagged), and for stderr a short
// tail kept for the failure summary.

#include <cstdint>
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

// A rank's log file under --log-dir. It gets every byte, unless a write fails (a full disk):
// then the file ends there, a clean prefix of the stream, and what follows is counted as lost.
// Writing on once space is freed would leave a hole in the middle of a file that looks whole.
class LogFile {
 public:
  LogFile() = default;  // no file
  LogFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~LogFile() { close(); }
  LogFile(LogFile&& other) noexcept;
  LogFile& operator=(LogFile&&) = delete;

  void write(std::string_view data);
  void close();

  const std::string& path() const { return path_; }
  std::uint64_t written() const { return written_; }
  std::uint64_t lost() const { return lost_; }
  int error() const { return error_; }  // errno of the write that failed, 0 if none

 private:
  int fd_ = -1;
  std::string path_;
  std::uint64_t written_ = 0, lost_ = 0;
  int error_ = 0;
};

class RankOutput {
 public:
  RankOutput(Console& console, Channel channel, std::string prefix, LogFile log, bool keep_tail)
      : console_(console, channel, std::move(prefix)), log_(std::move(log)), keep_tail_(keep_tail) {}
  RankOutput(const RankOutput&) = delete;
  RankOutput& operator=(const RankOutput&) = delete;

  void feed(const char* data, std::size_t size);
  // End of stream: the console gets the last partial line (with a newline added); the file
  // has had every byte it could take, and is closed.
  void finish();
  const OutputTail& tail() const { return tail_; }
  const LogFile& log() const { return log_; }

 private:
  LineForwarder console_;
  LogFile log_;
  bool keep_tail_;
  OutputTail tail_;
};

}  // namespace idist::launchers::detail
