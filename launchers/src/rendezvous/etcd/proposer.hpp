#pragma once
// The etcd rendezvous' job side, held by the node that holds the key `proposer`: it applies
// the rules (rendezvous/rules.hpp) to the job as it reads it (proposal.hpp) and proposes the
// next state by a transaction that holds only if the state is still the one it read. It owns
// the rules' timers (the round's last call and join timeout, the members' time to stop, a stall
// report's wait for views) and nothing of the node's own side (coordinator.cpp).

#include <boost/asio.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "idist/launchers/etcd_rendezvous.hpp"
#include "proposal.hpp"
#include "stall/stall_report.hpp"

namespace idist::launchers::etcd_rdzv {

class Proposer {
 public:
  struct Io {
    std::function<void(Json body)> txn;  // sends /v3/kv/txn; its answer makes the node read again
    std::function<void()> read;          // read the job again: its answer comes back to propose()
    std::function<void(const std::string&)> info;
    std::string etcd;  // the endpoints tried, for words
    // This node as the others watch it under live recovery ({id, addr, store, for, lease}),
    // once its store for `attempt` is open; null before.
    std::function<Json(int attempt)> self;
  };
  Proposer(boost::asio::io_context& io, const EtcdRendezvousOptions& options, std::string prefix, Io out);

  // The rules applied to the job as read: the next state proposed, if they change it.
  void propose(const Snapshot& s);
  // At the proposer's first read: what a finished job of this id left behind, cleared unless
  // another of its nodes is there (`self`: this node's id). True when it proposed that.
  bool clear_leftover(const Snapshot& s, const std::string& self);
  void cancel();

 private:
  rules::Limits limits() const;
  std::chrono::milliseconds stop_limit() const;
  void arm_phase_timers(const Snapshot& s);
  void arm_last_call(int k);
  void propose_stall_report(const Snapshot& s);
  void wait_for_views(std::uint64_t id);
  void txn(const Snapshot& s, const Json& next, std::vector<Json> more = {});
  void txn_ops(const Snapshot& s, Json ops);
  Json delete_range(const std::string& from) const;

  const EtcdRendezvousOptions& options_;
  std::string prefix_;
  Io out_;
  boost::asio::steady_timer last_call_timer_, join_timer_, stop_timer_, gather_timer_;
  int last_call_for_ = -1;  // the attempt whose last call has passed
  int last_call_armed_ = -1;
  int gathering_seen_ = -1;  // since when this proposer has seen attempt K gather (its join timeout)
  bool join_timed_out_ = false;
  int ending_seen_ = -1;  // since when attempt K ends (dropping members that never stop)
  bool stop_passed_ = false;
  // Job-wide stall reports: the request it made, when its answers are due, the next one's
  // earliest time, and what was reported (each collective once per attempt).
  std::uint64_t gather_id_ = 0;
  bool gather_due_ = false;
  std::chrono::steady_clock::time_point next_gather_{};
  detail::CallKeys stalls_reported_;
  int stalls_attempt_ = -1;
};

}  // namespace idist::launchers::etcd_rdzv
