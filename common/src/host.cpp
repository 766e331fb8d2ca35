#include "idist/common/host.hpp"

#include <unistd.h>

#include <climits>
#include <fstream>

namespace idist::common {

std::string host_name(std::string_view fallback) {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return std::string(fallback);
  return name;
}

int host_cores() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::string host_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char pid_ns[64] = {};
  const auto n = ::readlink("/proc/self/ns/pid", pid_ns, sizeof(pid_ns) - 1);
  return host_name("unknown") + " " + (boot_id.empty() ? "no-boot-id" : boot_id) + " " +
         (n > 0 ? std::string(pid_ns, static_cast<std::size_t>(n)) : std::string("no-pid-ns"));
}

}  // namespace idist::common
