#pragma once

#include <string>
#include <string_view>

namespace idist::common {

// gethostname(2), or `fallback` when it fails (each caller knows what to say then: "localhost"
// for a launcher's own node, "unknown" in a report).
std::string host_name(std::string_view fallback);

// Which processes can share memory with this one: equal for two processes exactly when they
// run on one kernel (its boot id) and see each other's pids (their pid namespace), with the
// host name for people and for containers that give each its own. Not NODE_RANK, which is a
// user's guess that two idist-run "nodes" on one machine would get wrong either way.
std::string host_identity();

}  // namespace idist::common
