#pragma once
// fork/exec of one rank, kept apart from the supervisor's bookkeeping because the child side
// has rules of its own (only async-signal-safe calls between fork and exec).

#include <sys/types.h>

#include "idist/launchers/supervisor.hpp"

namespace idist::launchers::detail {

struct SpawnedRank {
  pid_t pid = -1;
  int out_fd = -1;  // read ends of the rank's stdout and stderr pipes (close-on-exec)
  int err_fd = -1;
};

// Starts `spec` in its own process group with PR_SET_PDEATHSIG (SIGKILL), stdout and stderr
// on fresh pipes, stdin from ours for rank 0 when that is not a terminal, else /dev/null;
// then execs it, or calls its entry in the forked child (ProcessSpec::entry).
// Throws std::system_error naming the call that failed; nothing is left open then.
SpawnedRank spawn_rank(const ProcessSpec& spec);

}  // namespace idist::launchers::detail
