#pragma once
// The job-wide straggler comparison on the built-in rendezvous (issue 47): each node's idist-run
// compares only the ranks it runs, which names nobody where a node runs one rank, or where a
// whole node is slow; so every node shares its ranks' work counters ("work", wire.hpp) and the
// rendezvous compares all the attempt's ranks with one StragglerDetector, once every live member
// has shared some, and tells every node the lines ("straggler").

#include <chrono>
#include <map>
#include <optional>
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
  // Node `node`'s samples in `attempt`, at its --straggler-threshold; `members`: the attempt's
  // live node ranks. What to tell every node, where something changed.
  std::optional<Said> heard(int attempt, int node, double threshold, std::vector<launchers::detail::WorkSample> samples,
                            const std::vector<int>& members);

 private:
  int attempt_ = -1;
  std::optional<launchers::detail::StragglerDetector> detector_;
  std::map<int, std::vector<launchers::detail::WorkSample>> latest_;  // by node rank
  std::map<int, double> told_;
  std::chrono::steady_clock::time_point next_{};
};

}  // namespace idist::launchers::rendezvous
