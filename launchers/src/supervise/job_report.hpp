#pragma once
// What the job says about itself: a failure's lines (which rank, how, its last stderr lines),
// the closing lines, the bytes --log-dir lost and the console dropped, and summary.json.
// The words of the outcome are policy.hpp's; this writes them out and keeps the record.

#include <memory>
#include <string>
#include <vector>

#include "idist/launchers/coordinator.hpp"
#include "idist/launchers/supervisor.hpp"
#include "output/console.hpp"
#include "output/run_summary.hpp"
#include "rank_process.hpp"

namespace idist::launchers::supervision {

class JobReport {
 public:
  JobReport(const SuperviseOptions& options, std::string host, detail::Console& console)
      : options_(options), host_(std::move(host)), console_(console) {}

  // "attempt 0: rank 1 (pid 123 on host) exited with code 3, stopped rank(s) 0; <then>", its
  // last stderr lines, and a word when the peer it lost had returned early.
  void failure(const LiveAttempt& a, const std::string& then) const;
  // The last lines of the attempt's first failure's stderr.
  void stderr_tail(const LiveAttempt& a) const;
  // `rank`'s failure as the rendezvous hears of it. Its output may not all be in yet at its first
  // report; the final one (Coordinator::over) has it.
  static LocalFailure local_failure(const Rank& rank);
  // The first failure of `a`, for supervise_job's caller.
  JobResult::Failure failure_record(const LiveAttempt& a) const;

  // A line for each log file that could not take every byte; a job that succeeded otherwise
  // does not exit 0 (kLogLossExit).
  void log_loss(const std::vector<std::unique_ptr<LiveAttempt>>& attempts, detail::RunRecord& run) const;
  // After the console is done with: what it dropped, then summary.json, which records it.
  void finish(detail::RunRecord& run) const;

  const std::string& host() const { return host_; }

 private:
  void early_exit(const LiveAttempt& a) const;
  void dropped(detail::Channel channel, const detail::RunRecord& run) const;
  void write_summary(detail::RunRecord& run) const;
  std::string run_dir() const;  // DIR/<run-id>

  const SuperviseOptions& options_;
  std::string host_;
  detail::Console& console_;
};

}  // namespace idist::launchers::supervision
