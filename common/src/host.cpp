#include "idist/common/host.hpp"

#include <unistd.h>

#include <climits>

namespace idist::common {

std::string host_name(std::string_view fallback) {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return std::string(fallback);
  return name;
}

}  // namespace idist::common
