#pragma once
// fork/exec of one rank, kept apart from the supervisor's bookkeeping because the child side
// has rules of its own (only async-signal-safe calls between fork and exec).

#include <sys/types.h>

#include <cstddef>

#include "idist/launchers/process_spec.hpp"

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

// A memfd of `bytes` (zeros) for ranks to inherit (ProcessSpec::pass_fds): close-on-exec here,
// numbered 3 or above (a launcher started with stdin closed would otherwise hand it out as 0,
// which the rank's stdin then replaces), its size sealed (a rank's child that truncated it
// would make every reader's next load SIGBUS). -1 where it cannot be made.
int memfd_for_ranks(const char* name, std::size_t bytes);

}  // namespace idist::launchers::detail
