#include "idist/common/addresses.hpp"

#include <sys/socket.h>

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

}  // namespace idist::common
