#pragma once
// Our descendants, found through /proc. idist-run is a child subreaper, so a process that a
// rank forked and then left behind (a daemonised helper, a double fork, a setsid) is
// re-parented to us rather than to init: every live descendant has a parent chain back to us,
// even one that left its rank's process group. That makes "everything below us" exact without
// trusting environment variables, which a helper may change and which other jobs may share.

#include <sys/types.h>

#include <string>
#include <vector>

namespace idist::launchers::detail {

// Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER); false if the kernel refuses.
bool become_subreaper();

// Every process below `root` in the process tree, zombies included.
std::vector<pid_t> descendants_of(pid_t root);

// /proc/PID/stat's fields from the third (the state) on, so that field N is at N - 3: the
// command name before them may hold spaces and parentheses, and is skipped by its last ')'.
// Empty when the process is gone.
std::vector<std::string> proc_stat_fields(pid_t pid);

// Whether `pid` has begun to exit (PF_EXITING: its fatal signal or exit() is being carried
// out, its files being closed) or is a zombie; false when /proc cannot tell.
bool is_exiting(pid_t pid);

// Sends `sig` to every descendant of ours; returns how many there were.
std::size_t signal_descendants(int sig);

// Every rank, and so everything it starts, carries this "IDIST_SUPERVISOR=<pid>-<nonce>"
// in its environment: unique to this idist-run process, unlike IDIST_RUN_ID, which every
// node of a job shares (and several "nodes" may share one host).
const std::string& supervisor_marker();

// What outlives a SIGKILLed idist-run. PDEATHSIG takes the ranks down with it, but a helper
// that a rank forked into its own session is re-parented to init, out of anyone's reach.
// The guardian is a process outside our tree (double fork, started before we become a
// subreaper, in its own session) that waits until we exit, however we exit, and then
// SIGKILLs every process still carrying supervisor_marker() in its environment: helpers
// keep the environment they were forked with. After a normal exit the run has been cleaned
// up already and the scan finds nothing. Call while idist-run is single-threaded.
void start_guardian();

// Processes other than us whose environment holds `assignment` ("IDIST_RUN_ID=abc").
std::vector<pid_t> processes_with_env(const std::string& assignment);

}  // namespace idist::launchers::detail
