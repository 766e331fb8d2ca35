#pragma once
// Live recovery in idist-run (docs/RECOVERY.md). When a rank is lost (killed, crashed, or
// stopped as frozen by the heartbeat watch) and every rank still running opted in
// (idist::InitOptions::recovery: it beats a heartbeat), the attempt does not end: the
// survivors, whose collectives raised PeerLostError, wait in idist::reform() for the next
// generation, which idist-run announces in a store of its own once the losses of a short
// settle have come in. The store is idist-run's, not rank 0's, so that losing rank 0 costs
// nothing more. A failing exit of the program's own (non-zero) still ends the attempt: that is
// the program's verdict, not a loss.

#include <boost/asio.hpp>
#include <chrono>
#include <optional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rank_process.hpp"

namespace idist::detail {
class TcpStoreServer;
}

namespace idist::launchers::supervision {

// What decides whether the survivors of a lost rank go on.
struct RecoveryFacts {
  bool offered = false;  // --recovery auto, on one node, with the generation store up
  bool lost = false;     // killed or crashed (Blame::root_cause), not a failing exit of its own
  int survivors = 0;     // ranks of the attempt still running
  int opted_in = 0;      // of them, those that beat a heartbeat (InitOptions::recovery)
  int min_world = 1;     // --min-world
};
// "" where the survivors go on; else why the attempt ends instead.
std::string why_not_reform(const RecoveryFacts& facts);

class LiveRecovery {
 public:
  // `wanted`: --recovery auto and a job on one node; `min_world`: --min-world.
  LiveRecovery(asio::io_context& io, bool wanted, int min_world);
  ~LiveRecovery();
  LiveRecovery(const LiveRecovery&) = delete;
  LiveRecovery& operator=(const LiveRecovery&) = delete;

  // Gives each rank of a new attempt IDIST_RECOVERY_STORE (host:port of the generation
  // store, started at the first attempt); nothing where recovery is not offered.
  void offer(Attempt& attempt);
  // `rank` of `attempt` has just ended; `root_cause`: as Blame says. True where the survivors
  // go on without it (said now; the generation is announced after a settle); false where the
  // attempt ends as after any failure.
  bool take_loss(LiveAttempt& attempt, Rank& rank, bool root_cause);
  // The index of the rank of `attempt` lost last, where that was moments ago: a survivor that
  // fails then (its program does not call reform()) fails of that loss, which is to blame as
  // it would be without live recovery.
  std::optional<std::size_t> recent_loss(const LiveAttempt& attempt) const;
  // At the attempt's end: a loss that was never announced (every survivor ended first), or a
  // member of the last generation that ended without joining it (its program never called
  // reform()), left the loss unrecovered: the index of the lost rank, which the attempt's
  // failure is, as without live recovery. Nothing where every loss was recovered from.
  std::optional<std::size_t> unrecovered(const LiveAttempt& attempt);
  // `rank` of `attempt` ended its program (exit 0) while others run: said in the store, so that
  // a survivor waiting in reform() for it raises at once (uneven steps are not a loss).
  void ended(const LiveAttempt& attempt, const Rank& rank);
  // The attempt is being stopped: nothing more is announced.
  void stand_down() { settle_.cancel(); }

 private:
  void announce(LiveAttempt& attempt);

  bool wanted_;
  int min_world_;
  asio::steady_timer settle_;
  std::unique_ptr<idist::detail::TcpStoreServer> store_;
  std::uint64_t generation_ = 0;
  std::vector<const Rank*> lost_;     // every rank lost this attempt
  std::size_t announced_ = 0;         // lost_[announced_..] are not announced yet
  std::size_t last_cause_ = 0;        // lost_[last_cause_]: the last generation's first loss
  std::vector<int> members_;          // the last generation's (generation-0 ranks); none yet: all
  const LiveAttempt* attempt_ = nullptr;
  std::chrono::steady_clock::time_point last_loss_{};
};

}  // namespace idist::launchers::supervision
