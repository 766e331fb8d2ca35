#include "idist/launchers/supervisor.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <boost/asio.hpp>
#include <cstring>
#include <memory>
#include <optional>

#include "line_forwarder.hpp"

namespace idist::launchers {
namespace {

namespace asio = boost::asio;

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  std::string text = "was killed by " + signal_name(WTERMSIG(status));
  if (WCOREDUMP(status)) text += " (core dumped)";
  return text;
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

// One rank's output stream (stdout or stderr) on its way to ours.
struct Stream {
  Stream(asio::io_context& io, int fd, int out_fd, std::string prefix)
      : pipe(io, fd), forwarder(out_fd, std::move(prefix)) {}
  asio::posix::stream_descriptor pipe;
  LineForwarder forwarder;
  std::array<char, 64 * 1024> buffer{};
  bool open = true;
};

struct Rank {
  const ProcessSpec* spec = nullptr;
  pid_t pid = -1;
  std::unique_ptr<asio::posix::stream_descriptor> pidfd;
  std::unique_ptr<Stream> out, err;
  std::optional<int> status;  // wait status once reaped
  bool collateral = false;    // stopped by us, not failed on its own
  bool running() const { return pid > 0 && !status; }
};

class Supervisor {
 public:
  Supervisor(const std::vector<ProcessSpec>& specs, const SuperviseOptions& options)
      : options_(options), ranks_(specs.size()) {
    for (std::size_t i = 0; i < specs.size(); ++i) ranks_[i].spec = &specs[i];
    teardown_signals_.add(SIGQUIT);  // asio's constructor takes at most three
  }

  int run() {
    // A rank's closed pipe must not kill us; and the console may go away before we finish.
    ::signal(SIGPIPE, SIG_IGN);
    teardown_signals_.async_wait([this](auto ec, int sig) { on_teardown_signal(ec, sig); });
    forward_signals_.async_wait([this](auto ec, int sig) { on_forward_signal(ec, sig); });
    for (auto& rank : ranks_) {
      if (tearing_down_) break;  // a signal arrived or a spawn failed: start nothing more
      spawn(rank);
    }
    maybe_finish();
    io_.run();
    return result();
  }

 private:
  void spawn(Rank& rank) {
    const ProcessSpec& spec = *rank.spec;
    std::vector<char*> argv, envp;
    for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const std::string exec_error = "idist-run: rank " + std::to_string(spec.rank) + ": cannot execute " + spec.path + ": ";

    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return spawn_failed(spec, "pipe");
    // stdin goes to rank 0 when it is a file or pipe (as mpirun does); a terminal is not
    // shared, because ranks run in background process groups and would stop on SIGTTIN.
    const bool give_stdin = spec.rank == 0 && !::isatty(STDIN_FILENO);
    const int devnull = give_stdin ? -1 : ::open("/dev/null", O_RDONLY | O_CLOEXEC);

    // Block signals across fork so that no handler of ours runs in the child.
    sigset_t all, previous;
    ::sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &previous);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Child: only async-signal-safe calls from here to exec.
      for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_DFL);
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // idist-run died before the prctl took hold
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
      ::execve(spec.path.c_str(), argv.data(), envp.data());
      const char* why = ::strerror(errno);
      [[maybe_unused]] auto a = ::write(STDERR_FILENO, exec_error.data(), exec_error.size());
      [[maybe_unused]] auto b = ::write(STDERR_FILENO, why, std::strlen(why));
      [[maybe_unused]] auto c = ::write(STDERR_FILENO, "\n", 1);
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    ::close(out[1]);
    ::close(err[1]);
    if (devnull >= 0) ::close(devnull);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      errno = fork_errno;
      return spawn_failed(spec, "fork");
    }
    ::setpgid(pid, pid);  // also in the parent, so that it holds before we ever signal the group
    rank.pid = pid;
    spdlog::debug("started rank {} as pid {}", spec.rank, pid);

    const std::string prefix = options_.tag_output ? "[rank " + std::to_string(spec.rank) + "] " : "";
    rank.out = std::make_unique<Stream>(io_, out[0], STDOUT_FILENO, prefix);
    rank.err = std::make_unique<Stream>(io_, err[0], STDERR_FILENO, prefix);
    read_more(*rank.out);
    read_more(*rank.err);

    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd < 0) {
      // Without a pidfd we could not see this rank exit: refuse to run blind.
      ::kill(pid, SIGKILL);
      collect(rank, 0);
      return spawn_failed(spec, "pidfd_open");
    }
    rank.pidfd = std::make_unique<asio::posix::stream_descriptor>(io_, pidfd);
    rank.pidfd->async_wait(asio::posix::stream_descriptor::wait_read, [this, &rank](auto ec) {
      if (!ec) reap(rank);
    });
  }

  void spawn_failed(const ProcessSpec& spec, const char* what) {
    spdlog::error("cannot start rank {}: {}: {}", spec.rank, what, std::strerror(errno));
    spawn_error_ = true;
    teardown(SIGTERM);
  }

  void read_more(Stream& stream) {
    stream.pipe.async_read_some(asio::buffer(stream.buffer), [this, &stream](auto ec, std::size_t n) {
      if (n > 0) stream.forwarder.feed(stream.buffer.data(), n);
      if (!ec) return read_more(stream);
      close_stream(stream);
      maybe_finish();
    });
  }

  void close_stream(Stream& stream) {
    if (!stream.open) return;
    stream.open = false;
    stream.forwarder.finish();
    boost::system::error_code ignored;
    stream.pipe.close(ignored);
  }

  // Collects the rank's exit status; with WNOHANG, only if it has already exited.
  bool collect(Rank& rank, int flags) {
    if (rank.status) return true;
    int status = 0;
    pid_t got;
    while ((got = ::waitpid(rank.pid, &status, flags)) < 0 && errno == EINTR) {
    }
    if (got != rank.pid) return false;
    rank.status = status;
    boost::system::error_code ignored;
    if (rank.pidfd) rank.pidfd->close(ignored);
    spdlog::debug("rank {} (pid {}) {}", rank.spec->rank, rank.pid, describe(status));
    return true;
  }

  void reap(Rank& rank) {
    if (!collect(rank, 0)) return;
    if (!succeeded(*rank.status) && !tearing_down_) {
      first_failure_ = &rank;
      // Ranks that already ended on their own are not collateral: collect them first.
      for (auto& other : ranks_)
        if (other.running()) collect(other, WNOHANG);
      teardown(SIGTERM);
    }
    if (!std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running(); })) all_exited();
    maybe_finish();
  }

  // Every rank is gone. A grandchild may still hold a pipe open; give it a moment, then stop
  // reading rather than wait forever.
  void all_exited() {
    kill_timer_.cancel();
    if (tearing_down_) {
      // Leftovers in the ranks' process groups (helpers they forked) go too.
      for (auto& r : ranks_)
        if (r.pid > 0) ::kill(-r.pid, SIGKILL);
    }
    drain_timer_.expires_after(std::chrono::seconds(2));
    drain_timer_.async_wait([this](auto ec) {
      if (ec) return;
      for (auto& r : ranks_) {
        if (r.out) close_stream(*r.out);
        if (r.err) close_stream(*r.err);
      }
      maybe_finish();
    });
  }

  void teardown(int sig) {
    if (!tearing_down_) {
      tearing_down_ = true;
      kill_timer_.expires_after(options_.grace);
      kill_timer_.async_wait([this](auto ec) {
        if (!ec) signal_running(SIGKILL);
      });
    }
    for (auto& r : ranks_)
      if (r.running()) r.collateral = true;
    signal_running(sig);
  }

  void signal_running(int sig) {
    for (auto& r : ranks_)
      if (r.running()) ::kill(-r.pid, sig);
  }

  void on_teardown_signal(const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (tearing_down_) {
      spdlog::warn("{} again: killing every rank now", signal_name(sig));
      signal_running(SIGKILL);
    } else {
      interrupted_by_ = sig;
      spdlog::info("{}: stopping every rank", signal_name(sig));
      teardown(sig);
    }
    teardown_signals_.async_wait([this](auto e, int s) { on_teardown_signal(e, s); });
  }

  void on_forward_signal(const boost::system::error_code& ec, int sig) {
    if (ec) return;
    spdlog::info("forwarding {} to every rank", signal_name(sig));
    signal_running(sig);
    forward_signals_.async_wait([this](auto e, int s) { on_forward_signal(e, s); });
  }

  void maybe_finish() {
    for (const auto& r : ranks_) {
      if (r.running()) return;
      if ((r.out && r.out->open) || (r.err && r.err->open)) return;
    }
    boost::system::error_code ignored;
    teardown_signals_.cancel(ignored);
    forward_signals_.cancel(ignored);
    kill_timer_.cancel();
    drain_timer_.cancel();
  }

  std::string collateral_list() const {
    std::string list;
    for (const auto& r : ranks_)
      if (r.collateral) list += (list.empty() ? "" : ", ") + std::to_string(r.spec->rank);
    return list.empty() ? std::string() : "; stopped rank(s) " + list;
  }

  int result() const {
    if (first_failure_ != nullptr) {
      const Rank& r = *first_failure_;
      spdlog::error("rank {} (pid {}) {}{}", r.spec->rank, r.pid, describe(*r.status), collateral_list());
      return exit_code_of(*r.status);
    }
    if (interrupted_by_) {
      spdlog::error("interrupted by {}{}", signal_name(*interrupted_by_), collateral_list());
      return 128 + *interrupted_by_;
    }
    if (spawn_error_) return 1;
    return 0;
  }

  SuperviseOptions options_;
  asio::io_context io_;
  asio::signal_set teardown_signals_{io_, SIGINT, SIGTERM, SIGHUP};  // + SIGQUIT, added in the constructor
  asio::signal_set forward_signals_{io_, SIGUSR1, SIGUSR2};
  asio::steady_timer kill_timer_{io_};
  asio::steady_timer drain_timer_{io_};
  std::vector<Rank> ranks_;
  bool tearing_down_ = false;
  bool spawn_error_ = false;
  const Rank* first_failure_ = nullptr;
  std::optional<int> interrupted_by_;
};

}  // namespace

int supervise(const std::vector<ProcessSpec>& processes, const SuperviseOptions& options) {
  return Supervisor(processes, options).run();
}

}  // namespace idist::launchers
