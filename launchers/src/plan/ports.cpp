#include "idist/launchers/ports.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "idist/common/addresses.hpp"
#include "idist/common/hash.hpp"
#include "idist/launchers/program.hpp"
#include "parse_whole.hpp"

namespace idist::launchers {
namespace {

int parse_port(std::string_view what, std::string_view text, std::string_view whole) {
  const auto value = parse_whole<int>(text);
  if (!value || *value < 1 || *value > 65535)
    throw std::invalid_argument(std::string(what) + " '" + std::string(whole) +
                                "': expected LO-HI with ports from 1 to 65535");
  return *value;
}

}  // namespace

PortRange parse_port_range(std::string_view what, std::string_view text) {
  const auto dash = text.find('-');
  if (dash == std::string_view::npos)
    throw std::invalid_argument(std::string(what) + " '" + std::string(text) + "': expected LO-HI, e.g. 20000-32767");
  PortRange range{parse_port(what, text.substr(0, dash), text), parse_port(what, text.substr(dash + 1), text)};
  if (range.first > range.last)
    throw std::invalid_argument(std::string(what) + " '" + std::string(text) + "': LO is above HI");
  return range;
}

int derived_port(std::string_view job, std::uint64_t step, PortRange range) {
  const auto span = static_cast<std::uint64_t>(range.last - range.first + 1);
  return range.first + static_cast<int>((common::fnv1a(job) % span + step % span) % span);
}

PortReservation::PortReservation(const std::string& host, std::string_view named_by) {
  const auto tried = common::try_addresses(host, "0", SOCK_STREAM, [&](const addrinfo& ai, std::string& why) {
    const int fd = ::socket(ai.ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      return false;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::bind(fd, ai.ai_addr, ai.ai_addrlen) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      return false;
    }
    port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                             : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    fd_ = fd;
    return true;
  });
  if (!tried.resolved) throw UsageError("cannot resolve " + std::string(named_by) + " '" + host + "': " + tried.error);
  if (!tried.ok)
    throw std::runtime_error("cannot reserve a port on " + std::string(named_by) + " '" + host + "': " + tried.error);
}

PortReservation::~PortReservation() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace idist::launchers
