#pragma once
// Straggler watching (issue 47): every 100 ms and a millisecond a rank, the ranks' own work (their metrics: the time
// between collectives, the steps) and what /proc says of their processes, given to a
// StragglerDetector (stall/straggler.hpp), whose lines idist-run says. Off with
// --straggler-threshold 0. Each node compares its own ranks.

#include <boost/asio.hpp>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "stall/straggler.hpp"

namespace idist::launchers::supervision {

namespace asio = boost::asio;
struct LiveAttempt;

class StragglerWatch {
 public:
  StragglerWatch(asio::io_context& io, double threshold, std::string host);
  // Reads from now on while `watched` gives an attempt whose ranks run; `say` gets each line.
  void start(std::function<LiveAttempt*()> watched, std::function<void(const std::string&)> say);
  // While `job_wide()` (the rendezvous compares every node's ranks), the samples go to `share`
  // (JSON text, about four times a second) instead of this node's own comparison. Before start().
  void share_with(std::function<bool()> job_wide, std::function<void(const std::string& samples)> share) {
    job_wide_ = std::move(job_wide);
    share_ = std::move(share);
  }
  void stop();
  // Ranks named and not yet back under the threshold: rank -> its excess (0.23: 23% longer).
  const std::map<int, double>& current() const { return detector_.current(); }

 private:
  void check();
  std::vector<detail::WorkSample> read(const LiveAttempt& attempt);

  asio::steady_timer timer_;
  double threshold_;
  std::string host_;
  detail::StragglerDetector detector_;
  std::function<LiveAttempt*()> watched_;
  std::function<void(const std::string&)> say_;
  std::function<bool()> job_wide_;
  std::function<void(const std::string&)> share_;
  std::chrono::steady_clock::time_point next_share_{};
  std::map<pid_t, std::string> cpu_stats_;  // each rank process's cgroup cpu.stat, read once
  bool stopped_ = false;
};

}  // namespace idist::launchers::supervision
