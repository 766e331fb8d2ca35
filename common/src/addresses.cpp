#include "idist/common/addresses.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <memory>

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

}  // namespace idist::common
