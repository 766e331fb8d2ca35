#include "idist/common/addresses.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace idist::common {

AddressesTried try_addresses(std::string_view host, std::string_view service, int socktype,
                             const std::function<bool(const addrinfo& address, std::string& why)>& attempt) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = socktype;
  addrinfo* list = nullptr;
  AddressesTried tried;
  if (const int rc = ::getaddrinfo(std::string(host).c_str(), std::string(service).c_str(), &hints, &list); rc != 0) {
    tried.error = ::gai_strerror(rc);
    return tried;
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(list, &::freeaddrinfo);  // also if attempt throws
  tried.resolved = true;
  tried.error = "no address";
  for (const auto* ai = list; ai != nullptr && !tried.ok; ai = ai->ai_next) tried.ok = attempt(*ai, tried.error);
  return tried;
}

std::string local_address_towards(std::string_view host, int port, AddressesTried& tried) {
  std::string address;
  tried = try_addresses(host, std::to_string(port), SOCK_DGRAM, [&](const addrinfo& ai, std::string& why) {
    const int fd = ::socket(ai.ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      why = std::strerror(errno);
      return false;
    }
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai.ai_addr, ai.ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) address = text;
    } else {
      why = std::strerror(errno);
    }
    ::close(fd);
    return !address.empty();
  });
  return address;
}

bool wait_fd(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::clamp<long long>(left, 0, 1 << 30)));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
  }
}

int connect_within(const addrinfo& address, std::chrono::steady_clock::time_point deadline, std::string& why) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, address.ai_protocol);
  if (fd < 0) {
    why = std::strerror(errno);  // EMFILE under load says more than "no address"
    return -1;
  }
  int rc = ::connect(fd, address.ai_addr, address.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    if (wait_fd(fd, POLLOUT, deadline)) {
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    } else {
      errno = ETIMEDOUT;
    }
  }
  if (rc != 0) {
    why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace idist::common
