#pragma once
// Large collective messages between hosts over plain TCP sockets, beside UCX.
//
// Where UCX reaches another host over TCP alone (no RDMA device), it copies
// every byte through its own buffers (8 KiB segments out, a receive buffer in)
// and polls epoll on every progress call; Open MPI's btl/tcp writes from the
// user's buffer and reads into it, a megabyte per system call. A lane is one
// socket per pair of hosts' ranks that does the same: a message is a 16-byte
// header (the collective's tag and its length) and the bytes, sent from and
// received into the caller's buffer, in the order the collective posts them.
//
// Only collectives use lanes: their sends to one peer and that peer's receives
// are posted in the same order on both sides (the algorithms are deterministic
// and a group runs one collective at a time), which is what a byte stream
// needs. Point-to-point keeps UCX's tag matching. The header turns a mismatch
// (ranks in different collectives, or sizes) into an error rather than bytes in
// the wrong buffer.
//
// Not thread-safe: the ucx backend calls it under its worker's lock.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "idist/env_contract.hpp"
#include "store/store.hpp"

namespace idist::detail {

class TcpLanes {
 public:
  enum class State { kPending, kDone, kLost, kMismatch, kBroken };
  struct Transfer {
    char* data = nullptr;
    std::size_t bytes = 0;
    std::uint64_t tag = 0;
    bool recv = false;
    std::size_t header_moved = 0;
    std::size_t moved = 0;
    State state = State::kPending;
    std::string why;  // not kPending or kDone: what happened, for the error
    char header[16];  // a receive's header as it arrives
  };

  // `address`: the local address to listen on (the interface UCX was given: what
  // peers reach), empty where this rank offers no lane. A lane to a peer exists
  // when both offer one and `apart(peer)` (another host: within one, UCX's
  // shared memory is the better path). Every member's threshold
  // (IDIST_UCX_TCP_FROM) is the same: init() compared them. Publishes under
  // `prefix`, connects, and gives up at `deadline`, naming the peer by `who`.
  TcpLanes(Store& store, const std::string& prefix, int rank, int size, const std::string& address,
           const std::function<bool(int)>& apart, std::chrono::steady_clock::time_point deadline,
           const std::function<std::string(int)>& who);
  ~TcpLanes();
  TcpLanes(const TcpLanes&) = delete;
  TcpLanes& operator=(const TcpLanes&) = delete;

  bool to(int peer) const { return fds_[static_cast<std::size_t>(peer)] >= 0; }

  std::shared_ptr<Transfer> send(const void* data, std::size_t bytes, int peer, std::uint64_t tag);
  std::shared_ptr<Transfer> recv(void* data, std::size_t bytes, int peer, std::uint64_t tag);

  // Moves what the sockets take now, for every lane; a lane whose peer is gone
  // fails its transfers (kLost).
  void progress();

  // A collective failed part way on this rank: every lane with transfers still
  // queued is out of step from here (kBroken), and its peer is told by the
  // connection's end.
  void break_pending(const std::string& why);

  // A transfer given up before it ended (a deadline, another peer's failure):
  // the stream to its peer is out of step from here, so that lane fails every
  // later transfer (kBroken).
  void abandon(const std::shared_ptr<Transfer>& transfer, int peer);

 private:
  struct Lane {
    std::deque<std::shared_ptr<Transfer>> sends, recvs;
    // kPending while usable; else lost or out of step (kLost, kBroken), and every later
    // transfer fails at once with this state and why.
    State state = State::kPending;
    std::string why;
    bool broken() const { return state != State::kPending; }
  };
  void push(std::deque<std::shared_ptr<Transfer>>& queue, const std::shared_ptr<Transfer>& t, int peer);
  void progress(int peer);
  void lose(int peer, const std::string& why, State state);

  std::vector<int> fds_;
  std::vector<Lane> lanes_;
};

// What member `r` published under prefix + r, waited for until the deadline; else a
// TimeoutFailure: "ucx: <who> <late>: stopped, or never reached this group's creation?".
std::vector<char> read_published(Store& store, const std::string& prefix, int r,
                                 std::chrono::steady_clock::time_point deadline, const std::string& who,
                                 const std::string& late);

// Bytes from which collectives' messages to another host take a lane:
// IDIST_UCX_TCP_FROM, "off" (kNoLanes) for never; unset, the measured default
// (docs/BENCHMARKS.md).
constexpr std::size_t kNoLanes = env::Contract::Tuning::kNever;
std::size_t tcp_lanes_from(const env::Contract& contract);

}  // namespace idist::detail
