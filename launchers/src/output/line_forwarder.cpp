#include "line_forwarder.hpp"

namespace idist::launchers {

void LineForwarder::emit(std::string_view line) {
  if (prefix_.empty()) return console_.write(channel_, line);
  std::string out;
  out.reserve(prefix_.size() + line.size());
  out.append(prefix_).append(line);
  console_.write(channel_, out);
}

void LineForwarder::feed(const char* data, std::size_t size) {
  std::string_view in(data, size);
  // Lines go straight from the read buffer, unless the start of one is held back.
  while (!in.empty()) {
    const auto nl = in.find('\n');
    if (nl == std::string_view::npos) {
      pending_.append(in);
      // A progress bar (tqdm) redraws its line after a '\r' and may not end it for a whole
      // epoch: what comes up to its last '\r' goes now, not at the line's end. Not a '\r' that
      // ends the read: it may be half of a "\r\n", whose line goes whole.
      if (const auto cr = pending_.rfind('\r'); cr != std::string::npos && cr + 1 < pending_.size()) {
        emit(std::string_view(pending_).substr(0, cr + 1));
        pending_.erase(0, cr + 1);
      }
      if (pending_.size() >= kMaxLine) {
        emit(pending_);
        pending_.clear();
      }
      return;
    }
    if (!pending_.empty()) {
      pending_.append(in.substr(0, nl + 1));
      emit(pending_);
      pending_.clear();
      in.remove_prefix(nl + 1);
      continue;
    }
    // Untagged, every whole line of the read goes in one write: still whole lines, fewer calls.
    const auto end = prefix_.empty() ? in.rfind('\n') : nl;
    emit(in.substr(0, end + 1));
    in.remove_prefix(end + 1);
  }
}

void LineForwarder::finish() {
  if (pending_.empty()) return;
  pending_.push_back('\n');
  emit(pending_);
  pending_.clear();
}

}  // namespace idist::launchers
