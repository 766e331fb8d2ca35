#include "idist/launchers/pmi.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>

#include "idist/common/addresses.hpp"
#include "idist/launchers/detect.hpp"
#include "parse_whole.hpp"

namespace idist::launchers {
namespace {

using Clock = std::chrono::steady_clock;
using Fields = std::map<std::string, std::string, std::less<>>;

// One PMI session over a connected socket. Every failure names the endpoint.
class Session {
 public:
  Session(const PmiEndpoint& endpoint, int fd) : endpoint_(endpoint), fd_(fd) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw DetectError("MPICH Hydra (PMI-1): " + endpoint_.from + ": " + what);
  }

  void send(const std::string& line) {
    const std::string wire = line + "\n";
    std::size_t sent = 0;
    while (sent < wire.size()) {
      const auto n = ::send(fd_, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("cannot send '" + line + "': " + std::strerror(errno) + " (is this process the task mpiexec started?)");
      sent += static_cast<std::size_t>(n);
    }
  }

  // The next line's fields; `expect` is the cmd it must carry.
  Fields receive(std::string_view expect) {
    const auto deadline = Clock::now() + kPmiTimeout;
    std::size_t end;
    while ((end = buffer_.find('\n')) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) fail("no answer to " + std::string(expect) + " within " + std::to_string(kPmiTimeout.count()) + " s");
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) fail(std::string("poll: ") + std::strerror(errno));
      if (ready == 0) continue;
      char chunk[1024];
      const auto n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail("cannot read the answer to " + std::string(expect) + ": " + std::strerror(errno));
      if (n == 0) fail("the PMI server closed the connection before answering " + std::string(expect));
      buffer_.append(chunk, static_cast<std::size_t>(n));
      if (buffer_.size() > 64 * 1024) fail("an answer longer than 64 KiB: not a PMI-1 server");
    }
    const std::string line = buffer_.substr(0, end);
    buffer_.erase(0, end + 1);
    Fields fields;
    std::string_view rest = line;
    while (!rest.empty()) {
      const auto space = rest.find(' ');
      const auto word = rest.substr(0, space);
      rest = space == std::string_view::npos ? std::string_view{} : rest.substr(space + 1);
      if (word.empty()) continue;
      const auto eq = word.find('=');
      if (eq == std::string_view::npos) fail("unexpected answer '" + line + "'");
      fields.emplace(std::string(word.substr(0, eq)), std::string(word.substr(eq + 1)));
    }
    if (const auto cmd = fields.find("cmd"); cmd == fields.end() || cmd->second != expect)
      fail("expected cmd=" + std::string(expect) + ", got '" + line + "'");
    if (const auto rc = fields.find("rc"); rc != fields.end() && rc->second != "0")
      fail(std::string(expect) + " failed: '" + line + "'");
    return fields;
  }

  std::string field(const Fields& fields, std::string_view name, std::string_view cmd) const {
    const auto it = fields.find(name);
    if (it == fields.end() || it->second.empty()) fail(std::string(cmd) + " has no " + std::string(name));
    return it->second;
  }

  int number(const Fields& fields, std::string_view name, std::string_view cmd, int min) const {
    const auto text = field(fields, name, cmd);
    const auto value = parse_whole<int>(text);
    if (!value || *value < min) fail(std::string(cmd) + ": " + std::string(name) + "='" + text + "' is not a count");
    return *value;
  }

 private:
  const PmiEndpoint& endpoint_;
  int fd_;
  std::string buffer_;
};

int connect_to(const PmiEndpoint& endpoint) {
  int fd = -1;
  const auto tried = common::try_addresses(
      endpoint.host, std::to_string(endpoint.port), SOCK_STREAM, [&](const addrinfo& ai, std::string& why) {
        fd = ::socket(ai.ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
          why = std::strerror(errno);
          return false;
        }
        if (::connect(fd, ai.ai_addr, ai.ai_addrlen) == 0) return true;
        why = std::strerror(errno);
        ::close(fd);
        fd = -1;
        return false;
      });
  if (!tried.resolved)
    throw DetectError("MPICH Hydra (PMI-1): " + endpoint.from + ": cannot resolve '" + endpoint.host +
                      "': " + tried.error);
  if (!tried.ok) throw DetectError("MPICH Hydra (PMI-1): " + endpoint.from + ": cannot connect: " + tried.error);
  return fd;
}

PmiAnswer ask(const PmiEndpoint& endpoint) {
  const bool own_socket = endpoint.fd < 0;
  const int fd = own_socket ? connect_to(endpoint) : endpoint.fd;
  struct Closer {
    int fd;
    bool own;
    ~Closer() {
      if (own) ::close(fd);
    }
  } closer{fd, own_socket};

  Session s(endpoint, fd);
  PmiAnswer answer;
  if (own_socket) {
    // MPICH's simple client: initack first, then the server pushes size, rank and debug.
    s.send("cmd=initack pmiid=" + std::to_string(endpoint.id));
    s.receive("initack");
    answer.size = s.number(s.receive("set"), "size", "set size", 1);
    answer.rank = s.number(s.receive("set"), "rank", "set rank", 0);
    s.receive("set");  // debug
  }
  s.send("cmd=init pmi_version=1 pmi_subversion=1");
  s.receive("response_to_init");
  s.send("cmd=get_my_kvsname");
  answer.kvsname = s.field(s.receive("my_kvsname"), "kvsname", "my_kvsname");
  // Without it, Hydra's proxy takes our (or, for PMI_FD, the program's) exit for a crash.
  s.send("cmd=finalize");
  s.receive("finalize_ack");
  return answer;
}

}  // namespace

PmiAnswer ask_pmi_server(const PmiEndpoint& endpoint) {
  static std::mutex mutex;
  static std::map<std::string, PmiAnswer> asked;  // by endpoint.from
  std::lock_guard lock(mutex);
  if (const auto it = asked.find(endpoint.from); it != asked.end()) return it->second;
  auto answer = ask(endpoint);
  asked.emplace(endpoint.from, answer);
  return answer;
}

}  // namespace idist::launchers
