#pragma once
// Our descendants, found through /proc. idist-run is a child subreaper, so a process that a
// rank forked and then left behind (a daemonised helper, a double fork, a setsid) is
// re-parented to us rather than to init: every live descendant has a parent chain back to us,
// even one that left its rank's process group. That makes "everything below us" exact without
// trusting environment variables, which a helper may change and which other jobs may share.

#include <sys/types.h>

#include <vector>

namespace idist::launchers::detail {

// Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER); false if the kernel refuses.
bool become_subreaper();

// Every process below `root` in the process tree, zombies included.
std::vector<pid_t> descendants_of(pid_t root);

// Sends `sig` to every descendant of ours; returns how many there were.
std::size_t signal_descendants(int sig);

}  // namespace idist::launchers::detail
