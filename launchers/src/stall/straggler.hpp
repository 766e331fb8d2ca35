#pragma once
// Straggler reports (issue 47): which rank is slow, not only which is stuck. In a synchronous
// job the slow rank's own work (the time between its collectives) is longer than the others',
// who wait for it inside the collectives; so the ranks' work per step (or per call, where the
// program marks no steps) is compared over a sliding window, and a rank whose work exceeds the
// median by more than the threshold is named once per episode, with the cause where /proc
// tells it (a cpu it waited for, a cgroup that throttled it, pages it faulted in).

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace idist::launchers::detail {

// One rank's counters at one reading (cumulative: rank_metrics.hpp's and /proc's).
struct WorkSample {
  int rank = 0;
  int pid = 0;  // another process in the rank's place (a replacement, a restart): counted anew
  std::string host;
  std::uint64_t steps = 0;   // StepStats::steps
  std::uint64_t step_work_ns = 0;  // StepStats::work_ns: the work up to the last step mark
  std::uint64_t gaps = 0;    // WorkStats::gaps, over its rings
  std::uint64_t gap_ns = 0;  // WorkStats::gap_ns
  std::uint64_t run_ns = 0;    // /proc/PID/schedstat: on a cpu
  std::uint64_t wait_ns = 0;   // waiting for one (the cpu is shared)
  std::uint64_t major_faults = 0;
  std::uint64_t throttled_us = 0;  // its cgroup's cpu.stat (cpu.max)
};

// Samples as JSON text (an array), as a node sends them to the rendezvous for the job-wide
// comparison; and back: nullopt where the text is not such an array.
std::string samples_to_json(const std::vector<WorkSample>& samples);
std::optional<std::vector<WorkSample>> samples_from_json(const std::string& text);

struct StragglerOptions {
  double threshold = 0.10;          // a rank's work above the median by this share
  std::uint64_t window_steps = 20;  // compared over at most this many steps
  std::uint64_t first_steps = 4;    // and at least this many; a first report of an excess under
                                    // twice the threshold waits for twice as many
  double least_ms = 0.5;            // an excess below this a step (a hundredth of it a call) is noise
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerOptions options = {}) : options_(options) {}

  // The ranks' counters read now; the lines to say now (each straggler once per episode: it is
  // named again only after a window in which it was not one).
  std::vector<std::string> observe(const std::vector<WorkSample>& now);
  // Ranks named and not yet recovered (for the metrics and the summary).
  const std::map<int, double>& current() const { return named_; }
  void reset();

 private:
  struct Window;
  std::vector<Window> windows(const std::vector<WorkSample>& now) const;
  std::vector<double> step_work(const std::vector<WorkSample>& base) const;

  StragglerOptions options_;
  std::deque<std::vector<WorkSample>> history_;
  std::map<int, double> named_;  // rank -> its excess when named
};

}  // namespace idist::launchers::detail
