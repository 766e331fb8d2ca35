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

// The host's online processors, at least 1: where more ranks share a host than this, a rank
// that spins takes the core from the one it waits for. Not this process's affinity: a launcher
// that binds each rank to a core of its own (mpirun -np 2) leaves each one core, yet no rank
// then waits for a core.
int host_cores();

}  // namespace idist::common
