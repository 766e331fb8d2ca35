#pragma once
// Starts the local ranks and watches them until the job ends.
//
// Built on fork/exec with pidfds, driven by one Boost.Asio event loop (no polling), because a
// supervisor has to be exact about exit statuses (DESIGN.md §4: Boost.Process is not).
//  - Each rank runs in its own process group, with PR_SET_PDEATHSIG so that a kill -9 of
//    idist-run takes the ranks with it.
//  - The first rank to fail (non-zero exit or a signal) makes us SIGTERM the others, then
//    SIGKILL them after the grace period. Exit code: that rank's code, or 128+signal.
//  - SIGINT, SIGTERM, SIGHUP, SIGQUIT tear the job down the same way (a second one kills at
//    once; exit code 128+signal); SIGUSR1/SIGUSR2 are forwarded and the job goes on.
//  - Output is forwarded line by line (see LineForwarder), optionally tagged "[rank N] ".

#include <chrono>
#include <string>
#include <vector>

namespace idist::launchers {

struct ProcessSpec {
  int rank = 0;
  std::string path;               // resolved executable
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=value"
};

struct SuperviseOptions {
  bool tag_output = false;
  std::chrono::milliseconds grace = std::chrono::seconds(5);  // SIGTERM -> SIGKILL
};

// Runs the processes to the end and returns idist-run's exit code.
int supervise(const std::vector<ProcessSpec>& processes, const SuperviseOptions& options);

}  // namespace idist::launchers
