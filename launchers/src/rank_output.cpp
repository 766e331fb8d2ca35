#include "rank_output.hpp"

#include <unistd.h>

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

RankOutput::~RankOutput() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

void RankOutput::feed(const char* data, std::size_t size) {
  // The file first: if the console blocks or is gone, the log still has everything.
  if (log_fd_ >= 0) write_all(log_fd_, {data, size});
  if (keep_tail_) tail_.feed({data, size});
  console_.feed(data, size);
}

void RankOutput::finish() {
  console_.finish();
  // Closed now rather than at destruction: a job with many restarts keeps every attempt's
  // records until the end, but must not keep their files open.
  if (log_fd_ >= 0) ::close(log_fd_);
  log_fd_ = -1;
}

}  // namespace idist::launchers::detail
