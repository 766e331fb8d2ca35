#pragma once
// The ucx backend's transport: one UCP worker per group, so that a group's traffic is matched
// on its own worker and no tag of one group can meet another's; an endpoint to every member;
// and, where UCX reaches another host over TCP alone, TCP lanes beside it (tcp_lanes.hpp).
// Transfers are posted without blocking and waited for against a deadline; an error names the
// peer, the operation and ucx. The collectives built on it: algorithms.hpp.
//
// Endpoints ask UCX to report a peer's failure (UCP_ERR_HANDLING_MODE_PEER), so a killed peer
// fails the transfers waiting on it at once; a peer that is silent (a cut link) fails them at
// the call's deadline.
//
// Tags: kind (8 bits) | sender's group rank (24) | value (32): the collective's number in the
// group for collectives, the user's tag for point-to-point. UCX matches messages of one tag
// from one sender in the order they were sent, which is what orders the steps of a collective
// and what Backend::send promises for same-tag transfers.

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend.hpp"
#include "backends/ucx/context.hpp"
#include "backends/ucx/tcp_lanes.hpp"

namespace idist::detail::ucx {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kCollectiveKind = 1;
constexpr std::uint64_t kP2pKind = 2;

inline std::uint64_t make_tag(std::uint64_t kind, int sender, std::uint32_t value) {
  return kind << 56 | (static_cast<std::uint64_t>(sender) & 0xffffffu) << 32 | value;
}

// The receive side of a collective's tag: the sender's rank in the middle.
inline std::uint64_t from(std::uint64_t tag, int sender) {
  return (tag & ~(std::uint64_t{0xffffff} << 32)) | (static_cast<std::uint64_t>(sender) & 0xffffffu) << 32;
}

// One posted transfer. `req` is UCX's request while it is in flight (null when it completed
// at once or has been collected).
struct Op {
  void* req = nullptr;
  std::shared_ptr<TcpLanes::Transfer> lane;  // instead of req, where a TCP lane carries it
  bool done = false;
  bool recv = false;
  int peer = 0;
  ucs_status_t status = UCS_OK;
  std::size_t length = 0;  // received bytes
  std::size_t posted = 0;  // a receive's buffer
  // A collective's receive: a shorter message than posted is the peer in another call (UCX
  // completes it as a success), an error here, as a longer one is by UCX (truncated).
  bool exact = false;
  bool came_short = false;
};

// A group's worker, endpoints and names; shared with point-to-point completions, which may
// outlive the backend.
class Comm {
 public:
  Comm(const BackendInit& init, std::shared_ptr<Context> context);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string who(int peer) const { return word_ + std::to_string(names_[static_cast<std::size_t>(peer)]); }

  // Publishes our worker's address, reads every member's and makes an endpoint to each; then
  // the TCP lanes to other hosts, where UCX has no RDMA to reach them with.
  void connect(Store& store, const std::string& prefix, const env::Contract& contract, Clock::time_point deadline);

  Op send(const void* data, std::size_t bytes, int peer, std::uint64_t tag);
  Op recv(void* data, std::size_t bytes, int peer, std::uint64_t tag);

  // Point-to-point receives, for cancel_pending.
  void track(const std::shared_ptr<Op>& op);
  // The group is ending on this rank: receives still waiting fail now (UCS_ERR_CANCELED), so
  // that an irecv nobody will match does not hold the end for the timeout.
  void cancel_pending();

  // Waits until every op has completed; on a failure or at the deadline, cancels the rest and
  // throws naming the peer and `what` (the operation).
  void wait(std::span<Op> ops, Clock::time_point deadline, std::string_view what);

 private:
  struct Slot {
    Comm* comm;
    int peer;
  };

  static void on_peer_error(void* arg, ucp_ep_h, ucs_status_t status);
  void settle(Op& op, ucs_status_ptr_t ptr);
  // A collective's message between hosts over TCP (tcp_lanes.hpp); the peer is the message's
  // sender for a receive (the tag carries it), so both sides decide alike.
  bool on_lane(std::size_t bytes, int peer, std::uint64_t tag) const;
  void collect(Op& op);
  // A collective's short message is an error, raised as a truncated one is.
  static void check_length(Op& op);
  // Under mu_. A cancelled receive is never written to afterwards; a send to a dead or
  // silent peer is released when UCX gives up on it (ucp_request_free on one in flight).
  void cancel(std::span<Op> ops);
  [[noreturn]] void fail(const Op& op, std::string_view what);

  int rank_;
  int size_;
  std::shared_ptr<Context> context_;
  std::string word_;
  std::vector<int> names_;
  ucp_worker_h worker_ = nullptr;
  std::vector<ucp_ep_h> eps_;
  std::vector<ucs_status_t> failed_;
  std::vector<Slot> slots_;
  std::vector<std::weak_ptr<Op>> tracked_;
  std::vector<int> hosts_;
  std::unique_ptr<TcpLanes> lanes_;
  std::size_t lanes_from_ = kNoLanes;
  std::vector<std::string> lost_why_;  // a lane's peer lost: why (the TCP error), for the message
  std::mutex mu_;
};

}  // namespace idist::detail::ucx
