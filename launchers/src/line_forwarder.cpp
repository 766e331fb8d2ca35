#include "line_forwarder.hpp"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace idist::launchers {

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const auto n = ::write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else {
      return;
    }
  }
}

void LineForwarder::emit(std::string_view line) {
  if (prefix_.empty()) return write_all(out_fd_, line);
  std::string out;
  out.reserve(prefix_.size() + line.size());
  out.append(prefix_).append(line);
  write_all(out_fd_, out);
}

void LineForwarder::feed(const char* data, std::size_t size) {
  std::string_view in(data, size);
  // Fast path: nothing held back, so lines can go straight from the read buffer.
  while (!in.empty()) {
    const auto nl = in.find('\n');
    if (nl == std::string_view::npos) {
      pending_.append(in);
      if (pending_.size() >= kMaxLine) {
        emit(pending_);
        pending_.clear();
      }
      return;
    }
    if (pending_.empty()) {
      emit(in.substr(0, nl + 1));
    } else {
      pending_.append(in.substr(0, nl + 1));
      emit(pending_);
      pending_.clear();
    }
    in.remove_prefix(nl + 1);
  }
}

void LineForwarder::finish() {
  if (pending_.empty()) return;
  pending_.push_back('\n');
  emit(pending_);
  pending_.clear();
}

}  // namespace idist::launchers
