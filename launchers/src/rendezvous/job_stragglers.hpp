#pragma once
// The job-wide straggler comparison on the built-in rendezvous (issue 47): each node's idist-run
// compares only the ranks it runs, which names nobody where a node runs one rank, or where a
// whole node is slow; so every node shares its ranks' work counters ("work", wire.hpp) and the
// rendezvous compares the attempt's ranks with one StragglerDetector and tells every node the
// lines ("straggler"). It compares the nodes whose ranks run and that shared in the last
// kFresh: a node that ended its ranks, stopped sharing (--straggler-threshold 0 there) or went
// silent drops out (the detector starts its windows again for the ranks that are left).

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "stall/straggler.hpp"

namespace idist::launchers::rendezvous {

class JobStragglers {
 public:
  struct Said {
    std::vector<std::string> lines;
    std::map<int, double> named;  // rank -> excess, still stragglers
  };
  // Node `node`'s samples in `attempt`, at its --straggler-threshold; `running`: the attempt's
  // node ranks whose ranks still run. What to tell every node, where something changed (a new
  // attempt first tells that nobody is named any more).
  std::optional<Said> heard(int attempt, int node, double threshold, std::vector<launchers::detail::WorkSample> samples,
                            const std::set<int>& running);

 private:
  int attempt_ = -1;
  std::optional<launchers::detail::StragglerDetector> detector_;
  struct Shared {
    std::vector<launchers::detail::WorkSample> samples;
    std::chrono::steady_clock::time_point at;
  };
  std::map<int, Shared> latest_;  // by node rank
  std::map<int, double> told_;
  bool retell_ = false;  // the last attempt named someone: say that it is over
  std::chrono::steady_clock::time_point next_{};
};

}  // namespace idist::launchers::rendezvous
