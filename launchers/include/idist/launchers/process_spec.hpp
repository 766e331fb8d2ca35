#pragma once
// What the supervisor starts: one attempt's processes, as the caller (a launch plan, or
// idist::spawn) makes them. Attempt k > 0 is the k-th restart.

#include <functional>
#include <string>
#include <vector>

namespace idist::launchers {

struct ProcessSpec {
  int rank = 0;
  std::string path;               // resolved executable
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "NAME=value"
  std::vector<int> cpus;          // --bind: the cores it may run on; empty: ours
  // Set: the rank is this process forked, not `path` executed. The child, with `env` as its
  // environment and the descriptors exec would have closed closed, calls `entry` and exits
  // with what it returns (1, with the message on stderr, if it throws); it never returns
  // into the caller's stack. Only for a caller that is single-threaded when supervise()
  // starts: a fork copies every lock another thread holds (idist::spawn checks it).
  std::function<int()> entry;
  // With an entry: the caller's own descriptors, which stay open in the rank even when
  // close-on-exec (an entry may use what it captured); every other close-on-exec one closes.
  std::vector<int> inherited_fds;
  // Descriptors the rank keeps across exec although close-on-exec here (its flight recorder).
  std::vector<int> pass_fds;
};

// The processes of one attempt; attempt k > 0 is the k-th restart.
struct Attempt {
  std::vector<ProcessSpec> processes;
  int master_port = 0;  // for the summary
  int node_rank = -1;   // a job over several nodes: this node's in this attempt
};

// Makes attempt `restart_count` (0 first). May throw; a throw on a restart ends the job.
using MakeAttempt = std::function<Attempt(int restart_count)>;

}  // namespace idist::launchers
