#pragma once

#include <string>
#include <string_view>

namespace idist::common {

// gethostname(2), or `fallback` when it fails (each caller knows what to say then: "localhost"
// for a launcher's own node, "unknown" in a report).
std::string host_name(std::string_view fallback);

}  // namespace idist::common
