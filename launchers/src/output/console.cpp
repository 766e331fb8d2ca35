#include "console.hpp"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <vector>

#include "idist/launchers/logging.hpp"

namespace idist::launchers {
namespace detail {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

const char* channel_name(Channel channel) { return channel == Channel::out ? "stdout" : "stderr"; }

namespace {

std::size_t index_of(Channel channel) { return channel == Channel::out ? 0 : 1; }

// Queued output is kept in pieces of about this size, each of one channel.
constexpr std::size_t kPiece = 64 * 1024;
constexpr int kMaxPieces = 64;  // per writev

// A descriptor of our own for `fd`, to be written without blocking (see the header).
struct Opened {
  int fd = -1;
  bool socket = false;
  bool pipe = false;
  std::optional<int> restore_flags;  // O_NONBLOCK was set on the shared description
  int error = 0;
};

Opened open_for_writing(int fd) {
  Opened o;
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    o.error = errno;
    return o;
  }
  if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode) || S_ISSOCK(st.st_mode)) {
    o.socket = S_ISSOCK(st.st_mode);
    o.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (o.fd < 0) o.error = errno;
    return o;
  }
  o.pipe = S_ISFIFO(st.st_mode);
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  o.fd = ::open(self.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (o.fd >= 0) return o;
  o.fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (o.fd < 0) {
    o.error = errno;
    return o;
  }
  const int flags = ::fcntl(o.fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0 && ::fcntl(o.fd, F_SETFL, flags | O_NONBLOCK) == 0) o.restore_flags = flags;
  return o;
}

// Whether fds a and b are one pipe, socket or terminal, which lines of both must not cut.
bool same_stream(int a, int b) {
  struct stat x{}, y{};
  if (::fstat(a, &x) != 0 || ::fstat(b, &y) != 0) return false;
  return x.st_dev == y.st_dev && x.st_ino == y.st_ino && !S_ISREG(x.st_mode);
}

}  // namespace

// One file we write to: stdout's, stderr's, or both when they are the same stream.
class Console::Destination {
 public:
  Destination(asio::io_context& io, int fd) : io_(io), waiter_(io), stall_timer_(io) {
    const Opened o = open_for_writing(fd);
    if (o.fd < 0) {
      state_ = State::gone;
      why_ = std::string("it is closed (") + std::strerror(o.error) + ")";
      return;
    }
    fd_ = o.fd;
    socket_ = o.socket;
    pipe_ = o.pipe;
    restore_flags_ = o.restore_flags;
    boost::system::error_code ignored;  // a regular file cannot be waited for, and needs not be
    waiter_.assign(fd_, ignored);
  }

  ~Destination() {
    boost::system::error_code ignored;
    waiter_.cancel(ignored);
    if (waiter_.is_open()) waiter_.release();
    if (fd_ < 0) return;
    if (restore_flags_) ::fcntl(fd_, F_SETFL, *restore_flags_);
    ::close(fd_);
  }

  void write(Channel channel, std::string_view line) {
    if (line.empty()) return;
    if (closed_) return write_now(channel, line);
    if (state_ == State::gone) return drop(channel, line);
    if (queue_.empty()) {  // straight from the caller's buffer; only what the console does not take is copied
      while (!line.empty()) {
        const iovec iov{const_cast<char*>(line.data()), batch(line)};
        const ssize_t n = put(&iov, 1);
        if (n < 0) return drop(channel, line);
        if (n == 0) break;
        progress();
        line.remove_prefix(static_cast<std::size_t>(n));
      }
      if (line.empty()) return;
      enqueue(channel, line);
      return wait_writable();
    }
    // Whole lines or nothing: a line is dropped before any of it is written, never cut.
    if (state_ == State::stalled && queued_ + line.size() > kConsoleBuffer) return drop(channel, line);
    enqueue(channel, line);
    if (!waiting_) flush();
  }

  bool accepting() const { return state_ != State::ok || queued_ < kConsoleBuffer; }

  void when_accepting(std::function<void()> resume) {
    resume_.push_back(std::move(resume));
    if (accepting()) resume_all();
  }

  void close(std::function<void()> done) {
    closing_ = true;
    on_closed_ = std::move(done);
    if (queue_.empty() || state_ != State::ok) finish_close();
  }

  void abandon() {
    if (closing_) finish_close();
  }

  const Dropped& dropped(Channel channel) const { return dropped_[index_of(channel)]; }
  const std::string& why() const { return why_; }

 private:
  enum class State {
    ok,
    stalled,  // took nothing for kConsoleStall: lines that do not fit are dropped
    gone,     // its reader went away, or writes fail: everything is dropped
  };
  struct Piece {
    Channel channel;
    std::string text;
  };

  void enqueue(Channel channel, std::string_view line) {
    // The stall clock starts with the first byte the console has not taken.
    if (queue_.empty()) last_progress_ = Clock::now();
    if (!queue_.empty() && queue_.back().channel == channel && queue_.back().text.size() < kPiece)
      queue_.back().text.append(line);
    else
      queue_.push_back({channel, std::string(line)});
    queued_ += line.size();
  }

  // How much of `text` (lines from where the console is) to write in one go. Whatever the
  // console does not take waits in the queue, and what it took stays on its screen (or in its
  // pipe) even if the rest is dropped later: the reader stops, the job ends, and what was held
  // for it is dropped. A line must not be cut there. On a pipe, a write of PIPE_BUF bytes or
  // fewer is all or nothing, without blocking too (POSIX): so a pipe is written whole lines at a
  // time, at most PIPE_BUF bytes of them, or one longer line alone (which can still be cut;
  // its rest follows as long as the console takes anything). A terminal or a socket takes any
  // part of a write: they get everything at once, and a cut line's rest is counted as dropped.
  std::size_t batch(std::string_view text) const {
    if (!pipe_ || text.size() <= PIPE_BUF) return text.size();
    if (const auto nl = text.substr(0, PIPE_BUF).rfind('\n'); nl != std::string_view::npos) return nl + 1;
    const auto end = text.find('\n');
    return end == std::string_view::npos ? text.size() : end + 1;
  }

  // One non-blocking write: bytes written, 0 when it would block, -1 when the console is gone.
  ssize_t put(const iovec* iov, int count) {
    for (;;) {
      ssize_t n;
      if (socket_) {
        msghdr msg{};
        msg.msg_iov = const_cast<iovec*>(iov);
        msg.msg_iovlen = static_cast<std::size_t>(count);
        n = ::sendmsg(fd_, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      } else {
        n = ::writev(fd_, iov, count);
      }
      if (n > 0) return n;
      if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      if (errno == EINTR) continue;
      fail(errno);
      return -1;
    }
  }

  // Writes what the console takes now; waits for it to take more.
  void flush() {
    while (!queue_.empty()) {
      std::array<iovec, kMaxPieces> iov{};
      int count = 0;
      std::size_t total = 0;
      for (auto it = queue_.begin(); it != queue_.end() && count < kMaxPieces; ++it) {
        std::string_view text(it->text);
        text.remove_prefix(count == 0 ? head_ : 0);
        // A batch for a pipe (see batch()): whole pieces while they fit in PIPE_BUF, then the
        // lines of the next that still fit.
        const bool fits = !pipe_ || total + text.size() <= PIPE_BUF;
        if (!fits && count == 0) text = text.substr(0, batch(text));
        if (!fits && count > 0) {
          const auto nl = text.substr(0, PIPE_BUF - total).rfind('\n');
          if (nl == std::string_view::npos) break;
          text = text.substr(0, nl + 1);
        }
        iov[static_cast<std::size_t>(count++)] = {const_cast<char*>(text.data()), text.size()};
        total += text.size();
        if (!fits) break;
      }
      const ssize_t n = put(iov.data(), count);
      if (n < 0) return;  // gone: the queue was dropped
      if (n == 0) return wait_writable();
      consume(static_cast<std::size_t>(n));
      progress();
    }
    // The stall timer is left to expire: cancelling it here could race with a new wait.
    if (closing_) finish_close();
  }

  void consume(std::size_t n) {
    queued_ -= n;
    while (n > 0) {
      const std::size_t left = queue_.front().text.size() - head_;
      if (n < left) {
        head_ += n;
        return;
      }
      n -= left;
      head_ = 0;
      queue_.pop_front();
    }
  }

  void wait_writable() {
    watch_stall();
    if (waiting_ || state_ == State::gone || closed_) return;
    waiting_ = true;
    waiter_.async_wait(asio::posix::stream_descriptor::wait_write, [this](const boost::system::error_code& ec) {
      waiting_ = false;
      if (ec == asio::error::operation_aborted) return;
      if (ec) return fail(ec.value());
      flush();
    });
  }

  void watch_stall() {
    if (timing_ || state_ != State::ok || queue_.empty() || closed_) return;
    timing_ = true;
    stall_timer_.expires_at(last_progress_ + kConsoleStall);
    stall_timer_.async_wait([this](const boost::system::error_code& ec) {
      timing_ = false;
      if (ec || state_ != State::ok || queue_.empty()) return;
      if (Clock::now() - last_progress_ < kConsoleStall) return watch_stall();
      state_ = State::stalled;
      why_ = "its reader stopped reading (nothing taken for " + std::to_string(kConsoleStall.count()) + "s)";
      resume_all();  // the ranks' output is read on; the console's share of it is dropped
      if (closing_) finish_close();
    });
  }

  void progress() {
    last_progress_ = Clock::now();
    if (state_ == State::stalled) state_ = State::ok;
    // Half empty before the ranks are read again, rather than a read per line written.
    if (!resume_.empty() && queued_ <= kConsoleBuffer / 2) resume_all();
  }

  void fail(int error) {
    state_ = State::gone;
    why_ = error == EPIPE ? "its reader went away (broken pipe)" : std::string("cannot write: ") + std::strerror(error);
    drop_queue();
    boost::system::error_code ignored;
    waiter_.cancel(ignored);
    stall_timer_.cancel();
    resume_all();
    if (closing_) finish_close();
  }

  void finish_close() {
    if (closed_) return;
    closed_ = true;
    drop_queue();
    boost::system::error_code ignored;
    waiter_.cancel(ignored);
    stall_timer_.cancel();
    resume_.clear();
    asio::post(io_, std::move(on_closed_));
  }

  // After close(): the job's last lines, written at once, waiting kConsoleStall at most.
  void write_now(Channel channel, std::string_view line) {
    if (state_ != State::ok) return drop(channel, line);
    auto deadline = Clock::now() + kConsoleStall;
    while (!line.empty()) {
      const iovec iov{const_cast<char*>(line.data()), batch(line)};
      const ssize_t n = put(&iov, 1);
      if (n < 0) return drop(channel, line);
      if (n > 0) {
        progress();
        line.remove_prefix(static_cast<std::size_t>(n));
        deadline = Clock::now() + kConsoleStall;
        continue;
      }
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (wait <= 0) {
        state_ = State::stalled;
        why_ = "its reader stopped reading (nothing taken for " + std::to_string(kConsoleStall.count()) + "s)";
        return drop(channel, line);
      }
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(wait));
    }
  }

  void drop(Channel channel, std::string_view data) {
    auto& d = dropped_[index_of(channel)];
    d.bytes += data.size();
    d.lines += static_cast<std::uint64_t>(std::count(data.begin(), data.end(), '\n'));
  }

  void drop_queue() {
    for (std::size_t i = 0; i < queue_.size(); ++i)
      drop(queue_[i].channel, std::string_view(queue_[i].text).substr(i == 0 ? head_ : 0));
    queue_.clear();
    head_ = 0;
    queued_ = 0;
  }

  void resume_all() {
    for (auto& resume : std::exchange(resume_, {})) asio::post(io_, std::move(resume));
  }

  asio::io_context& io_;
  int fd_ = -1;
  bool socket_ = false;
  bool pipe_ = false;  // written a batch of whole lines at a time (see batch())
  std::optional<int> restore_flags_;
  asio::posix::stream_descriptor waiter_;  // fd_ for writability; fd_ stays ours
  asio::steady_timer stall_timer_;
  State state_ = State::ok;
  std::string why_;
  std::deque<Piece> queue_;
  std::size_t head_ = 0;    // bytes of queue_.front() written already
  std::size_t queued_ = 0;  // bytes not written yet
  Clock::time_point last_progress_;
  bool waiting_ = false, timing_ = false, closing_ = false, closed_ = false;
  std::function<void()> on_closed_;
  std::vector<std::function<void()>> resume_;
  std::array<Dropped, 2> dropped_{};
};

Console::Console(asio::io_context& io) : out_(std::make_unique<Destination>(io, STDOUT_FILENO)) {
  if (!same_stream(STDOUT_FILENO, STDERR_FILENO)) err_ = std::make_unique<Destination>(io, STDERR_FILENO);
}

Console::~Console() = default;

Console::Destination& Console::of(Channel channel) const { return channel == Channel::err && err_ ? *err_ : *out_; }

void Console::write(Channel channel, std::string_view line) { of(channel).write(channel, line); }

bool Console::accepting(Channel channel) const { return of(channel).accepting(); }

void Console::when_accepting(Channel channel, std::function<void()> resume) { of(channel).when_accepting(std::move(resume)); }

void Console::close(std::function<void()> done) {
  done_ = std::move(done);
  open_closes_ = err_ ? 2 : 1;
  out_->close([this] { destination_closed(); });
  if (err_) err_->close([this] { destination_closed(); });
}

void Console::destination_closed() {
  if (--open_closes_ == 0 && done_) std::exchange(done_, {})();
}

void Console::abandon() {
  out_->abandon();
  if (err_) err_->abandon();
}

const Dropped& Console::dropped(Channel channel) const { return of(channel).dropped(channel); }

const std::string& Console::why_dropped(Channel channel) const { return of(channel).why(); }

namespace {

// spdlog's sink for idist-run's own messages: to the supervisor's console while one is
// attached, else straight to stderr (nothing is being supervised then, so a blocking write
// holds nothing up).
class LogSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  Console* console = nullptr;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t text;
    formatter_->format(msg, text);
    const std::string_view line(text.data(), text.size());
    if (console != nullptr) return console->write(Channel::err, line);
    for (std::string_view rest = line; !rest.empty();) {
      const ssize_t n = ::write(STDERR_FILENO, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      rest.remove_prefix(static_cast<std::size_t>(n));
    }
  }
  void flush_() override {}
};

}  // namespace

void attach_log(Console* console) {
  for (const auto& sink : spdlog::default_logger()->sinks())
    if (auto* ours = dynamic_cast<LogSink*>(sink.get())) ours->console = console;
}

}  // namespace detail

void setup_logging(const std::string& name, bool verbose) {
  auto logger = std::make_shared<spdlog::logger>(name, std::make_shared<detail::LogSink>());
  logger->set_pattern(name + ": %v");
  logger->set_level(verbose ? spdlog::level::debug : spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

}  // namespace idist::launchers
