#include "backends/gloo/sockets.hpp"

#include <dirent.h>
#include <gloo/transport/tcp/address.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace idist::detail::gloo_sockets {

void shut_down_sockets(const SocketEnds& ends) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return;
  // Written by gloo's Address::str(), as the store's addresses were.
  const auto text = [](const sockaddr_storage& a, socklen_t length) {
    return gloo::transport::tcp::Address(reinterpret_cast<const sockaddr*>(&a), length).str();
  };
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    struct stat st {};
    if (end == entry->d_name || *end != '\0' || ::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode))
      continue;
    sockaddr_storage near{}, far{};
    socklen_t near_length = sizeof(near), far_length = sizeof(far);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&near), &near_length) != 0 ||
        ::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&far), &far_length) != 0 ||
        (far.ss_family != AF_INET && far.ss_family != AF_INET6))
      continue;
    if (ends.theirs.contains(text(far, far_length)) || ends.ours.contains(text(near, near_length)))
      ::shutdown(static_cast<int>(fd), SHUT_RDWR);
  }
  ::closedir(dir);
}

}  // namespace idist::detail::gloo_sockets
