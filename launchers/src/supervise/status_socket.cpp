#include "status_socket.hpp"

#include "idist/launchers/status.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace idist::launchers::detail {
namespace {

namespace asio = boost::asio;

constexpr const char* kPrefix = "idist-run.";

std::string name_of(uid_t uid, pid_t pid) { return kPrefix + std::to_string(uid) + "." + std::to_string(pid); }

// The abstract address of `name`: a leading NUL, and a length that counts no trailing one.
socklen_t address_of(const std::string& name, sockaddr_un& address) {
  std::memset(&address, 0, sizeof(address));
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), std::min(name.size(), sizeof(address.sun_path) - 2));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// Whoever connected is this user or root.
bool trusted(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  return cred.uid == ::getuid() || cred.uid == 0;
}

}  // namespace

struct StatusServer::Impl : std::enable_shared_from_this<StatusServer::Impl> {
  Impl(asio::io_context& io, std::function<std::string()> report)
      : acceptor(io), pause(io), report(std::move(report)) {}
  asio::local::stream_protocol::acceptor acceptor;
  asio::steady_timer pause;  // after a failed accept (no descriptors left): not a busy loop
  std::function<std::string()> report;

  void accept() {
    acceptor.async_accept([self = shared_from_this()](const boost::system::error_code& ec,
                                                      asio::local::stream_protocol::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec && trusted(socket.native_handle())) {
        auto text = std::make_shared<std::string>(self->report());
        auto peer = std::make_shared<asio::local::stream_protocol::socket>(std::move(socket));
        // A reader that never reads cannot hold the job: the write is asynchronous, and a
        // report is a few kilobytes, which the socket's buffer takes whole.
        asio::async_write(*peer, asio::buffer(*text), [text, peer](auto, std::size_t) {
          boost::system::error_code ignored;
          peer->shutdown(asio::socket_base::shutdown_both, ignored);
        });
      }
      if (ec) {
        self->pause.expires_after(std::chrono::milliseconds(200));
        self->pause.async_wait([self](auto e) {
          if (!e && self->acceptor.is_open()) self->accept();
        });
        return;
      }
      self->accept();
    });
  }
};

StatusServer::StatusServer(asio::io_context& io, std::function<std::string()> report)
    : impl_(std::make_shared<Impl>(io, std::move(report))) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un address;
  const auto len = address_of(name_of(::getuid(), ::getpid()), address);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&address), len) != 0 || ::listen(fd, 8) != 0) {
    spdlog::debug("idist-run --status will get no answer from this job: {}", std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return;
  }
  impl_->acceptor.assign(asio::local::stream_protocol(), fd);
  impl_->accept();
}

StatusServer::~StatusServer() {
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->pause.cancel();
}

std::vector<pid_t> jobs_answering_status() {
  // "@idist-run.<uid>.<pid>" in the last column of a listening socket's line.
  const std::string mine = "@" + std::string(kPrefix) + std::to_string(::getuid()) + ".";
  std::vector<pid_t> pids;
  std::ifstream table("/proc/net/unix");
  std::string line;
  while (std::getline(table, line)) {
    const auto at = line.rfind(' ');
    if (at == std::string::npos || line.compare(at + 1, mine.size(), mine) != 0) continue;
    const auto pid = static_cast<pid_t>(std::strtol(line.c_str() + at + 1 + mine.size(), nullptr, 10));
    if (pid > 0 && pid != ::getpid() && std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
  }
  std::sort(pids.begin(), pids.end());
  return pids;
}

}  // namespace idist::launchers::detail

namespace idist::launchers {

int print_status(std::optional<pid_t> pid) {
  if (!pid) {
    const auto jobs = detail::jobs_answering_status();
    if (jobs.empty()) {
      std::fprintf(stderr, "idist-run: --status: no idist-run of this user is running on this host\n");
      return 1;
    }
    if (jobs.size() > 1) {
      std::string list;
      for (auto p : jobs) list += (list.empty() ? "" : ", ") + std::to_string(p);
      std::fprintf(stderr, "idist-run: --status: %zu jobs are running here (idist-run pids %s): name one, as in "
                   "idist-run --status %d\n", jobs.size(), list.c_str(), jobs.front());
      return 2;
    }
    pid = jobs.front();
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address;
  const auto len = detail::address_of(detail::name_of(::getuid(), *pid), address);
  // A job too busy to answer within this is itself worth saying.
  const timeval patience{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &patience, sizeof(patience));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &patience, sizeof(patience));  // connect, when its backlog is full
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&address), len) != 0) {
    std::fprintf(stderr, "idist-run: --status %d: no idist-run job of this user answers as pid %d here (%s)\n", *pid,
                 *pid, std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return 1;
  }
  // Anyone may take an abstract name first: the answer counts only from this user (or root).
  if (!detail::trusted(fd)) {
    std::fprintf(stderr, "idist-run: --status %d: the socket of that name belongs to another user; not reading it\n",
                 *pid);
    ::close(fd);
    return 1;
  }
  std::string text;
  char buffer[4096];
  for (;;) {
    const auto n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      text.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      std::fprintf(stderr, "idist-run: --status %d: the job did not answer within 5s (%s)\n", *pid,
                   std::strerror(errno));
      return 1;
    }
    break;
  }
  ::close(fd);
  if (text.empty()) {
    std::fprintf(stderr, "idist-run: --status %d: the job closed the connection without an answer\n", *pid);
    return 1;
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace idist::launchers
