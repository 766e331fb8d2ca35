#pragma once
// Stall watching: the ranks' flight recorders read every kStallCheck, a stall report when a
// rank has waited in one collective longer than --stall-timeout (with the suspects' stacks
// where gdb can take them), the collectives the ranks called differently, and the text of
// `idist-run --status`. The report's words are stall_report.hpp's; what to do about a stall
// (report, or kill) is the supervisor's.

#include <sys/types.h>

#include <boost/asio.hpp>
#include <memory>
#include <mutex>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "idist/launchers/supervisor.hpp"
#include "rank_process.hpp"
#include "stall/stall_report.hpp"

namespace idist::launchers::supervision {

class StallWatch {
 public:
  StallWatch(asio::io_context& io, const SuperviseOptions& options, std::string host);
  ~StallWatch() { close(); }
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // Reads the recorders from now on, every kStallCheck, while `watched` gives an attempt whose
  // ranks run (nullptr: nothing to read now), and calls `stalled` with each new report.
  // Without --stall-timeout, the reading only dates the ranks' calls for --status.
  void start(std::function<LiveAttempt*()> watched, std::function<void(detail::StallReport)> stalled);
  void stop();
  // A new attempt: its collectives are reported afresh.
  void new_attempt();

  // Every started rank of `attempt`, its recorder read now.
  std::vector<detail::RankView> views(LiveAttempt& attempt);
  // The collectives the recorders of `attempt` disagree on, each said once. `running`: the
  // ranks may still reach a call some have not (see mismatch_report).
  void check_mismatches(LiveAttempt& attempt, bool running);
  bool mismatched() const { return !mismatches_reported_.empty(); }

  // The stacks of `ranks` by gdb, off the event loop (attaching takes a second or two), then
  // `done` on it with the lines; at once with none where gdb is not installed or not wanted.
  // A job that ends meanwhile does not wait for them (gdb may take 10 s a rank): their lines
  // are not said.
  void inspect_stacks(const std::vector<std::pair<int, pid_t>>& ranks, std::function<void(std::vector<std::string>)> done);
  // The event loop is going: an inspection that ends later posts nothing to it.
  void close();

  // `idist-run --status`: where the ranks of `attempt` are now (nullptr: none started yet).
  std::string status_text(LiveAttempt* attempt);
  // This node's ranks for a job-wide stall report (stall_report.hpp's JSON, under the
  // rendezvous' frame size); "[]" without an attempt.
  std::string job_views(LiveAttempt* attempt);

 private:
  void check();

  asio::io_context& io_;
  const SuperviseOptions& options_;
  std::string host_;
  asio::steady_timer timer_;
  std::function<LiveAttempt*()> watched_;
  std::function<void(detail::StallReport)> stalled_;
  detail::CallKeys stalls_reported_;        // this attempt's
  detail::CallKeys mismatches_reported_;    // the same
  detail::HeldMismatches mismatches_held_;  // seen before every rank of the group reached them
  bool stopped_ = false;
  // Where an inspection's thread posts its lines: the event loop until close(), then nowhere.
  struct Mailbox {
    std::mutex mutex;
    asio::io_context* io = nullptr;
  };
  std::shared_ptr<Mailbox> mailbox_ = std::make_shared<Mailbox>();
};

}  // namespace idist::launchers::supervision
