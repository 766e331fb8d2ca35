#pragma once
// idist-run's stdout and stderr as the supervisor writes them: from the event loop, never
// blocking it.
//
// A console that stops reading (a `| less` nobody pages, a `| sleep 30`, a terminal stopped
// with ^S) must not stop supervision: --timeout, signals and failure handling go on whatever
// the console does. So writes are non-blocking, and what the console cannot take yet waits in
// a queue. We do not set O_NONBLOCK on the file description we were given: the shell and the
// rest of the session share it, a terminal especially, and would be left with it after a
// kill -9. A pipe or a terminal is reopened through /proc/self/fd into a description of our
// own instead; a socket is written with MSG_DONTWAIT; a regular file never blocks. Only where
// none of that works do we set O_NONBLOCK on the shared description, and put it back after.
//
// The queue is bounded by kConsoleBuffer. A console that is slower than the ranks but keeps
// reading holds them back once the queue is full: we stop reading their pipes for it, as
// blocking writes used to, and no byte is lost. A console that takes nothing for kConsoleStall
// is stalled: we read on, and lines that do not fit are dropped, whole, and counted; once it
// takes bytes again it gets lines again. A console whose reader is gone (EPIPE, never
// SIGPIPE) or whose writes fail (a file on a full disk) gets nothing more. Rank log files are
// written before the console and keep every byte either way; what the console dropped is told
// once, at the end, and recorded in summary.json.
//
// Both channels share one queue when they are the same pipe, socket or terminal (2>&1), so
// that a line cut by a partial write is finished before the other channel's next line. A pipe
// is written whole lines at a time, PIPE_BUF bytes at most, which it takes whole or not at all:
// no line is left half in it when what we held for a stalled reader is dropped at the end.

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "run_summary.hpp"  // Dropped

namespace idist::launchers::detail {

enum class Channel { out, err };  // stdout or stderr: a rank's, and ours
const char* channel_name(Channel channel);

// The most output held for a console that is slow or stalled, per destination.
inline constexpr std::size_t kConsoleBuffer = 4 << 20;
// A console that takes no byte for this long, while we have some for it, is stalled.
inline constexpr std::chrono::seconds kConsoleStall{2};

class Console {
 public:
  // Our stdout and stderr (fds 1 and 2), written through `io`.
  explicit Console(boost::asio::io_context& io);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  // Writes one whole line (or a piece of a line too long to hold), queues it or drops it;
  // never blocks. After close(), writes at once or drops, waiting kConsoleStall at most.
  void write(Channel channel, std::string_view line);

  // Whether the ranks' output for `channel` should be read now: false while the console
  // holds kConsoleBuffer for a reader that is slow but not stalled.
  bool accepting(Channel channel) const;
  // Calls `resume` once, from the event loop, when `channel` accepts again.
  void when_accepting(Channel channel, std::function<void()> resume);

  // End of the job: calls `done` (from the event loop) once everything queued is written, or
  // what is left waits for a console that is stalled or gone (it is then dropped). A console
  // that keeps taking bytes is waited for.
  void close(std::function<void()> done);
  // Stop waiting at once (a signal during close()).
  void abandon();

  const Dropped& dropped(Channel channel) const;
  // Why lines of `channel` were dropped: "its reader stopped reading (nothing taken for 2s)".
  const std::string& why_dropped(Channel channel) const;

 private:
  class Destination;
  void destination_closed();
  Destination& of(Channel channel) const;

  std::unique_ptr<Destination> out_, err_;  // err_ empty: stderr is stdout's destination
  int open_closes_ = 0;
  std::function<void()> done_;
};

// idist-run's own messages (spdlog's default logger, as setup_logging() made it) go to
// `console` from now on, queued in order with the ranks' stderr lines; nullptr: straight
// to stderr again.
void attach_log(Console* console);

}  // namespace idist::launchers::detail
