#pragma once
// Live recovery in idist-run (docs/RECOVERY.md). When a rank is lost (killed, crashed, or
// stopped as frozen by the heartbeat watch) and every rank still running opted in
// (idist::InitOptions::recovery: it beats a heartbeat), the attempt does not end: the
// survivors, whose collectives raised PeerLostError, wait in idist::reform() for the next
// generation, announced in a store idist-run hosts (rendezvous/generations.hpp) once the
// losses of a short settle have come in. A failing exit of the program's own (non-zero) still
// ends the attempt: that is the program's verdict, not a loss.
//
// On one node this decides alone and hosts the store. Over several nodes it is the node's
// half: it says that its ranks opted in (Coordinator::capable) and reports a loss as
// recoverable; the rendezvous' rules decide for the job, the store is node 0's rendezvous' (on
// etcd each node's own, every node writing what the proposer decided), and every node hears of
// each generation (Events::reformed).
//
// Replacements (--max-restarts N): a rank is started in the lost one's place
// (IDIST_REPLACEMENT), under an origin of its own: on one node once the loss is announced, as
// the next index of the attempt's ranks; over several, once the rendezvous grants it from the
// job's budget with the loss (told before its generation on the built-in rendezvous, after it on
// etcd), numbered by it. Once it beats, it is
// announced as ready (";grow"), and the running ranks admit it at a step boundary they agree on
// (idist::Recovery). At most N in the job.

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "idist/launchers/coordinator.hpp"
#include "rank_process.hpp"

namespace idist::launchers::rendezvous {
class Generations;
}

namespace idist::launchers::supervision {

// What decides whether the survivors of a lost rank go on.
struct RecoveryFacts {
  bool offered = false;  // --recovery auto, with a generation store up
  bool lost = false;     // killed or crashed (Blame::root_cause), not a failing exit of its own
  int survivors = 0;     // this node's ranks of the attempt still running
  int opted_in = 0;      // of them, those that beat a heartbeat (InitOptions::recovery)
  int min_world = 1;     // --min-world
  bool joint = false;    // one node of several: the rendezvous counts the job's survivors
};
// "" where the survivors go on; else why the attempt ends instead.
std::string why_not_reform(const RecoveryFacts& facts);

class LiveRecovery {
 public:
  // `wanted`: --recovery auto; `min_world`: --min-world; `coordinator`: the job's rendezvous,
  // or null for a job on one node.
  LiveRecovery(asio::io_context& io, bool wanted, int min_world, Coordinator* coordinator);
  ~LiveRecovery();
  LiveRecovery(const LiveRecovery&) = delete;
  LiveRecovery& operator=(const LiveRecovery&) = delete;

  // Replacements: at most `max` in the job; `start` starts a rank made here (the process
  // context, in the attempt's log directory) and says why where it cannot; `recheck`, later
  // on the loop, looks again whether the attempt's ranks are all gone, once none is awaited.
  using StartRank = std::function<std::optional<std::string>(Rank&)>;
  void allow_replacements(int max, StartRank start, std::function<void()> recheck);
  // Over several nodes: a loss here was said to be replaceable and the rendezvous has not
  // answered yet (a replacement, or a generation without one): a node whose every rank is
  // gone is not over yet, since one may start.
  bool awaiting_replacement() const { return !awaited_.empty(); }
  // Sizes the attempt's ranks and records as its processes, with room for the replacements, so
  // that adding one moves no rank (the supervisor keeps pointers to them).
  void make_room(LiveAttempt& attempt) const;
  // Gives each rank of a new attempt IDIST_RECOVERY_STORE (host:port of the generation
  // store: started here on one node, the rendezvous' otherwise); nothing where recovery is
  // not offered.
  void offer(Attempt& attempt);
  // The attempt's ranks have started: over several nodes, the rendezvous hears once every one
  // of them opted in; on a node joining the attempt live, they are all replacements to admit.
  void started(LiveAttempt& attempt);
  // `rank` of `attempt` began to beat (the heartbeat watch says so once, and again once it
  // admits replacements): it opted in, and a replacement is ready to be admitted.
  void began(LiveAttempt& attempt, Rank& rank);
  // `rank` of `attempt` has just ended; `root_cause`: as Blame says. True where the survivors
  // go on without it (said now; the generation is announced after a settle; over several
  // nodes, the caller reports the loss as recoverable and the rendezvous decides); false where
  // the attempt ends as after any failure.
  bool take_loss(LiveAttempt& attempt, Rank& rank, bool root_cause);
  // The index of the rank of `attempt` lost last, where that was moments ago: a survivor that
  // fails then (its program does not call reform()) fails of that loss, which is to blame as
  // it would be without live recovery.
  std::optional<std::size_t> recent_loss(const LiveAttempt& attempt) const;
  // At the attempt's end: a loss that was never announced (every survivor ended first; over
  // several nodes, the rendezvous refused it and ended the attempt), or on one node a member of
  // the last generation that ended without joining it (its program never called reform()), left
  // the loss unrecovered: the index of the lost rank, which the attempt's failure is, as without
  // live recovery. Nothing where every loss was recovered from.
  std::optional<std::size_t> unrecovered(const LiveAttempt& attempt);
  // The job succeeded: over several nodes, a first failure that is a loss this node gave the
  // rendezvous to re-form without is none (a node whose every rank was lost says its failure
  // before it hears the re-form; the success verdict says the job went on without it).
  void forgive(const LiveAttempt& attempt, std::optional<std::size_t>& first_failure) const;
  // `rank` of `attempt` ended its program (exit 0) while others run: said in the store, so that
  // a survivor waiting in reform() for it raises at once (uneven steps are not a loss).
  void ended(const LiveAttempt& attempt, const Rank& rank);
  // Over several nodes: what the rendezvous says of recovery goes to the calls below, for the
  // attempt `current` answers.
  Coordinator::Events hear(Coordinator::Events events, std::function<LiveAttempt*()> current);
  // Over several nodes: the rendezvous formed a generation of `members`; `line` says what changed.
  void reformed(LiveAttempt* attempt, std::uint64_t generation, const std::string& line,
                const std::vector<int>& members);
  // Over several nodes: the rendezvous granted a replacement (Coordinator::Events::replace).
  void replace_granted(LiveAttempt* attempt, int lost, int origin, std::uint64_t after);
  // Over several nodes: every member of the job's generation ended; the replacements `unjoined`
  // that run here stop, not as failures.
  void members_ended(LiveAttempt* attempt, const std::vector<int>& unjoined);
  // --status's line on live recovery, or "" (none offered here, or no generation yet); over
  // several nodes, the last generation the rendezvous formed.
  std::string status_text();
  // The attempt is being stopped: nothing more is announced.
  void stand_down();

 private:
  bool joint() const { return coordinator_ != nullptr; }
  // Over several nodes: says to the rendezvous once every running rank here beats, and again
  // once every one admits replacements.
  void maybe_capable(const LiveAttempt& attempt);
  // On a node joining the attempt live: its ranks' admission, once every one still there beats.
  void admit_joined_node(const LiveAttempt& attempt);
  // Starts a rank in `lost`'s place, to join after `generation`, as `origin` where the
  // rendezvous numbered it.
  void replace(LiveAttempt& attempt, const Rank& lost, std::uint64_t generation, std::optional<int> origin = {});
  bool lose_unjoined(LiveAttempt& attempt, Rank& rank);
  // Whether a rank may be started in `rank`'s place, where the ranks left admit one.
  bool replaceable(const Rank& rank, bool survivors_admit) const;
  // `rank` is a replacement that has not joined a generation yet (it waits to join); over
  // several nodes, that no generation the rendezvous announced named it.
  bool waiting_to_join(const LiveAttempt& attempt, const Rank& rank) const;
  // The job's ranks all ended while replacements still wait to join: they stop, not as failures.
  void stop_unjoined(const LiveAttempt& attempt);
  void stop_waiting(const std::vector<const Rank*>& waiting);
  // Generation `generation` was taken by every member `seconds` after it was called for.
  void taken(std::uint64_t generation, double seconds);

  asio::io_context& io_;
  bool wanted_;
  int min_world_;
  Coordinator* coordinator_;
  std::unique_ptr<rendezvous::Generations> generations_;  // one node: the store it hosts
  bool offered_ = false;
  bool capable_ = false;              // over several nodes: said that every rank here opted in
  bool admits_said_ = false;          // and that every one admits replacements
  std::size_t covered_ = 0;           // over several nodes: lost_[..covered_] a generation went on from
  std::string heard_;                 // over several nodes: --status's line on the last generation
  std::vector<const Rank*> lost_;     // every rank lost this attempt
  std::size_t announced_ = 0;         // lost_[announced_..] are not announced yet
  std::size_t last_cause_ = 0;        // lost_[last_cause_]: the last generation's first loss
  LiveAttempt* attempt_ = nullptr;
  std::chrono::steady_clock::time_point last_loss_{};
  int max_replacements_ = 0;
  int replacements_ = 0;  // started here (on one node, the job's)
  StartRank start_rank_;
  std::function<void()> recheck_;
  std::vector<int> awaited_;  // over several nodes: losses said to be replaceable, not answered yet
  void answered(int lost);    // one of them was answered (all: -1)
  std::size_t world0_ = 0;                         // the attempt's ranks at its start (0: it joined live)
  std::vector<const Rank*> to_replace_;            // lost, to be replaced once announced
  std::vector<std::pair<Rank*, int>> joining_;     // replacements not beating yet, and whom they replace (-1: none)
  std::map<std::uint64_t, std::size_t> reform_index_;  // a generation's line in the record's reforms
  std::set<int> admitted_;  // over several nodes: the origins generations have named
};

}  // namespace idist::launchers::supervision
