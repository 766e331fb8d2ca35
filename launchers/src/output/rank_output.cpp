#include "rank_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <utility>

namespace idist::launchers::detail {

void OutputTail::feed(std::string_view data) {
  if (data.size() >= kKeep) {
    kept_.assign(data.substr(data.size() - kKeep));
    return;
  }
  kept_.append(data);
  // Trimmed in batches, so that a stream of small writes does not move the buffer every time.
  if (kept_.size() > 2 * kKeep) kept_.erase(0, kept_.size() - kKeep);
}

std::vector<std::string> OutputTail::last_lines(std::size_t max_lines, std::size_t max_width) const {
  std::vector<std::string> lines;
  std::string_view rest(kept_);
  while (!rest.empty() && lines.size() < max_lines) {
    while (!rest.empty() && (rest.back() == '\n' || rest.back() == '\r')) rest.remove_suffix(1);
    if (rest.empty()) break;
    const auto nl = rest.rfind('\n');
    const std::string_view line = nl == std::string_view::npos ? rest : rest.substr(nl + 1);
    lines.emplace_back(line.size() > max_width ? std::string(line.substr(0, max_width)) + "..." : std::string(line));
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(0, nl);
  }
  return {lines.rbegin(), lines.rend()};
}

LogFile::LogFile(LogFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), written_(other.written_), lost_(other.lost_),
      error_(other.error_) {}

void LogFile::write(std::string_view data) {
  if (fd_ < 0 || error_ != 0) {
    if (error_ != 0) lost_ += data.size();
    return;
  }
  while (!data.empty()) {
    const auto n = ::write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = n < 0 ? errno : ENOSPC;  // a regular file takes nothing only when it has no room
      lost_ += data.size();
      return;
    }
    written_ += static_cast<std::uint64_t>(n);
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

void LogFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RankOutput::feed(const char* data, std::size_t size) {
  // The file first: whatever the console does, the log has everything.
  log_.write({data, size});
  if (keep_tail_) tail_.feed({data, size});
  console_.feed(data, size);
}

void RankOutput::finish() {
  console_.finish();
  // Closed now rather than at destruction: a job with many restarts keeps every attempt's
  // records until the end, but must not keep their files open.
  log_.close();
}

}  // namespace idist::launchers::detail
