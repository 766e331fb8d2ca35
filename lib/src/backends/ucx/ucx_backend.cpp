// The ucx backend: UCP's tag API between the members of a group, every collective built here
// from non-blocking sends and receives (UCX has no collectives of its own; UCC would, but is
// not packaged here).
//
// One UCP context per process (made on first use, kept: UCX keeps state and threads past any
// point we could release it), one worker per group: a group's traffic is matched on its own
// worker, so no tag of one group can meet another's. Endpoints ask UCX to report a peer's
// failure (UCP_ERR_HANDLING_MODE_PEER), so a killed peer fails the transfers waiting on it
// at once; a peer that is silent (a cut link) fails them at the call's deadline. Every wait
// polls the worker against that deadline, and an error names the peer, the operation and ucx.
//
// Tags: kind (8 bits) | sender's group rank (24) | value (32): the collective's number in the
// group for collectives, the user's tag for point-to-point. UCX matches messages of one tag
// from one sender in the order they were sent, which is what orders the steps of a collective
// and what Backend::send promises for same-tag transfers.
//
// Where UCX reaches another host over TCP alone, a collective's messages of 64 KiB or more to
// it take a TCP lane instead (tcp_lanes.hpp: no copy through UCX's buffers); the rest, and
// point-to-point, stay on UCX.

#include "backends/ucx/ucx_backend.hpp"

#include <ifaddrs.h>
#include <netdb.h>
#include <sched.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backends/plugin.hpp"
#include "backends/ucx/tcp_lanes.hpp"
#include "common/cpus_shared.hpp"
#include "common/scratch.hpp"
#include "idist/common/addresses.hpp"
#include "in_step_error.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Below this many bytes, all_reduce runs recursive doubling (log2(n) rounds of whole
// messages); from it, a ring (reduce-scatter then all-gather: 2(n-1) rounds of 1/n each).
// Measured across two network namespaces over TCP (docs/BENCHMARKS.md, "UCX between hosts");
// IDIST_UCX_RING_FROM (bytes) overrides it, to measure it again elsewhere.
constexpr std::size_t kRingFrom = 256 * 1024;
// A ring step's block travels in segments of this size, each forwarded as soon as it is
// reduced, so that reducing one segment overlaps receiving the next.
constexpr std::size_t kSegment = 1024 * 1024;

constexpr std::uint64_t kCollectiveKind = 1;
constexpr std::uint64_t kP2pKind = 2;
constexpr std::uint64_t kFullMask = ~std::uint64_t{0};

std::uint64_t make_tag(std::uint64_t kind, int sender, std::uint32_t value) {
  return kind << 56 | (static_cast<std::uint64_t>(sender) & 0xffffffu) << 32 | value;
}

// The interface other hosts reach us on, as gloo chooses it: GLOO_SOCKET_IFNAME, else the
// one towards MASTER_ADDR. UCX would otherwise offer every interface it finds, loopback
// included, and a peer in another network namespace (or behind another route) would try
// addresses it cannot reach. Empty: leave UCX's own choice (UCX_NET_DEVICES, or all).
std::string interface_towards(const env::Contract& contract) {
  if (!contract.gloo_socket_ifname.empty()) return contract.gloo_socket_ifname;
  common::AddressesTried tried;
  const auto address = common::local_address_towards(contract.master_addr, contract.master_port, tried);
  if (address.empty()) return {};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string name;
  for (auto* a = list; a != nullptr && name.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_addr->sa_family != AF_INET && a->ifa_addr->sa_family != AF_INET6)) continue;
    char host[NI_MAXHOST];
    const socklen_t len = a->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(a->ifa_addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) == 0 && address == host)
      name = a->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

// Whether this host has an RDMA device (InfiniBand, RoCE, iWARP: all under
// /sys/class/infiniband). Without one, UCX reaches other hosts over TCP alone.
bool rdma_present() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

// The address a TCP lane listens on: that of the interface UCX was given (UCX_NET_DEVICES,
// where it names a network interface rather than an RDMA port), else of the one we give it
// (interface_towards); else the address towards MASTER_ADDR.
std::string lane_address(const env::Contract& contract) {
  std::string device;
  if (const char* given = std::getenv("UCX_NET_DEVICES"); given != nullptr && std::string_view(given) != "all") {
    device = std::string(given).substr(0, std::string(given).find(','));
    if (device.find(':') != std::string::npos) device.clear();
  }
  if (device.empty()) device = interface_towards(contract);
  std::string address;
  ifaddrs* list = nullptr;
  if (!device.empty() && ::getifaddrs(&list) == 0) {
    for (auto* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || device != a->ifa_name) continue;
      const auto family = a->ifa_addr->sa_family;
      if (family != AF_INET && !(family == AF_INET6 && address.empty())) continue;
      char host[NI_MAXHOST];
      const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      if (::getnameinfo(a->ifa_addr, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) == 0) address = host;
      if (family == AF_INET) break;  // IPv4 first, as the route towards the master would be
    }
    ::freeifaddrs(list);
  }
  if (!address.empty()) return address;
  common::AddressesTried tried;
  return common::local_address_towards(contract.master_addr, contract.master_port, tried);
}

class Context {
 public:
  explicit Context(ucp_context_h handle) : handle_(handle) {}
  ucp_context_h handle() const { return handle_; }

 private:
  ucp_context_h handle_;
};

// The process's context, made on first use with the first contract's interface. Never
// cleaned up (see the top of the file).
std::shared_ptr<Context> shared_context(const env::Contract& contract, std::string& why) {
  static std::mutex mu;
  static std::shared_ptr<Context> context;
  static std::string failure;
  const std::lock_guard lock(mu);
  if (context || !failure.empty()) {
    why = failure;
    return context;
  }
  ucp_config_t* config = nullptr;
  if (const auto status = ::ucp_config_read(nullptr, nullptr, &config); status != UCS_OK) {
    failure = std::string("cannot read UCX's configuration: ") + ::ucs_status_string(status);
    why = failure;
    return nullptr;
  }
  if (std::getenv("UCX_NET_DEVICES") == nullptr) {
    const auto device = interface_towards(contract);
    if (!device.empty()) ::ucp_config_modify(config, "NET_DEVICES", device.c_str());
  }
  // Over TCP alone, large messages go eagerly rather than by UCX's rendezvous: its handshake
  // (a request, then a grant) waits behind the data already queued on the link, which on a
  // shaped or busy one stalls every segment of the ring (1 Gbit/s: 70-81% of line rate from
  // 4 MiB, against 84-96% eager; docs/BENCHMARKS.md). With RDMA the rendezvous is UCX's
  // zero-copy path, and stays. UCX_RNDV_THRESH, set, is the user's.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr && !rdma_present()) ::ucp_config_modify(config, "RNDV_THRESH", "inf");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = 1;  // threads as ranks (tests), groups used from several threads
  ucp_context_h handle = nullptr;
  const auto status = ::ucp_init(&params, config, &handle);
  ::ucp_config_release(config);
  if (status != UCS_OK) {
    failure = std::string("ucp_init failed: ") + ::ucs_status_string(status);
    why = failure;
    return nullptr;
  }
  context = std::make_shared<Context>(handle);
  return context;
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
  Comm(const BackendInit& init, std::shared_ptr<Context> context)
      : rank_(init.rank), size_(init.size), context_(std::move(context)), word_(member_word(init)), hosts_(init.hosts) {
    for (int r = 0; r < size_; ++r) names_.push_back(name_of(init, r));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // every call is under mu_
    if (const auto s = ::ucp_worker_create(context_->handle(), &wp, &worker_); s != UCS_OK)
      throw std::runtime_error(std::string("ucx: cannot create a worker: ") + ::ucs_status_string(s));
    failed_.assign(static_cast<std::size_t>(size_), UCS_OK);
    lost_why_.resize(static_cast<std::size_t>(size_));
    slots_.resize(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) slots_[static_cast<std::size_t>(r)] = {this, r};
  }

  ~Comm() {
    std::lock_guard lock(mu_);
    // Closed with a flush, so that what we sent last (a barrier's message) still reaches the
    // peers; bounded, since a dead peer never acknowledges.
    std::vector<void*> closing;
    for (auto* ep : eps_) {
      if (ep == nullptr) continue;
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = 0;
      auto* req = ::ucp_ep_close_nbx(ep, &param);
      if (UCS_PTR_IS_PTR(req)) closing.push_back(req);
    }
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (!closing.empty() && Clock::now() < until) {
      ::ucp_worker_progress(worker_);
      std::erase_if(closing, [](void* req) {
        if (::ucp_request_check_status(req) == UCS_INPROGRESS) return false;
        ::ucp_request_free(req);
        return true;
      });
    }
    for (auto* req : closing) ::ucp_request_free(req);
    ::ucp_worker_destroy(worker_);
  }

  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string who(int peer) const { return word_ + std::to_string(names_[static_cast<std::size_t>(peer)]); }

  // Publishes our worker's address, reads every member's and makes an endpoint to each; then
  // the TCP lanes to other hosts, where UCX has no RDMA to reach them with.
  void connect(Store& store, const std::string& prefix, const env::Contract& contract, Clock::time_point deadline) {
    ucp_address_t* address = nullptr;
    std::size_t length = 0;
    if (const auto s = ::ucp_worker_get_address(worker_, &address, &length); s != UCS_OK)
      throw std::runtime_error(std::string("ucx: cannot read the worker's address: ") + ::ucs_status_string(s));
    const auto* bytes = reinterpret_cast<const char*>(address);
    store.set(prefix + std::to_string(rank_), std::vector<char>(bytes, bytes + length));
    ::ucp_worker_release_address(worker_, address);
    eps_.assign(static_cast<std::size_t>(size_), nullptr);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const auto key = prefix + std::to_string(r);
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      try {
        store.wait({key}, std::max(std::chrono::milliseconds(1), left));
      } catch (const TimeoutFailure&) {
        throw TimeoutFailure("ucx: " + who(r) + " did not publish its UCX address in time: stopped, or never reached "
                             "this group's creation?");
      }
      const auto peer = store.get(key);
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
      ep.address = reinterpret_cast<const ucp_address_t*>(peer.data());
      ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      ep.err_handler.cb = &Comm::on_peer_error;
      ep.err_handler.arg = &slots_[static_cast<std::size_t>(r)];
      const std::lock_guard lock(mu_);
      if (const auto s = ::ucp_ep_create(worker_, &ep, &eps_[static_cast<std::size_t>(r)]); s != UCS_OK)
        throw std::runtime_error("ucx: cannot reach " + who(r) + " (ucp_ep_create: " + ::ucs_status_string(s) + ")");
    }
    const auto apart = [this](int r) {
      return !hosts_.empty() && hosts_[static_cast<std::size_t>(r)] != hosts_[static_cast<std::size_t>(rank_)];
    };
    bool any_apart = false;  // the same answer on every member: the host map is the group's
    for (int r = 0; r < size_; ++r) any_apart = any_apart || apart(r);
    if (!any_apart) return;
    lanes_from_ = tcp_lanes_from(contract);
    const auto listen_on = lanes_from_ != kNoLanes && !rdma_present() ? lane_address(contract) : std::string();
    lanes_ = std::make_unique<TcpLanes>(store, prefix + "tcp/", rank_, size_, listen_on, apart, deadline,
                                        [this](int r) { return who(r); });
  }

  Op send(const void* data, std::size_t bytes, int peer, std::uint64_t tag) {
    Op op;
    op.peer = peer;
    ucp_request_param_t param{};
    const std::lock_guard lock(mu_);
    if (on_lane(bytes, peer, tag)) {
      op.lane = lanes_->send(data, bytes, peer, tag);
      return op;
    }
    const auto ptr = ::ucp_tag_send_nbx(eps_[static_cast<std::size_t>(peer)], data, bytes, tag, &param);
    settle(op, ptr);
    return op;
  }

  Op recv(void* data, std::size_t bytes, int peer, std::uint64_t tag) {
    Op op;
    op.peer = peer;
    op.recv = true;
    op.posted = bytes;
    op.exact = tag >> 56 == kCollectiveKind;
    ucp_tag_recv_info_t info{};
    ucp_request_param_t param{};
    // Always a request: UCX 1.13 leaves the length of a message completed at once unwritten.
    param.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.recv_info.tag_info = &info;
    const std::lock_guard lock(mu_);
    if (on_lane(bytes, peer, tag)) {
      op.lane = lanes_->recv(data, bytes, peer, tag);
      op.length = bytes;
      return op;
    }
    const auto ptr = ::ucp_tag_recv_nbx(worker_, data, bytes, tag, kFullMask, &param);
    settle(op, ptr);
    if (op.done) op.length = info.length;
    check_length(op);
    return op;
  }

  // Point-to-point receives, for cancel_pending.
  void track(const std::shared_ptr<Op>& op) {
    const std::lock_guard lock(mu_);
    std::erase_if(tracked_, [](const std::weak_ptr<Op>& w) { return w.expired(); });
    tracked_.push_back(op);
  }
  // The group is ending on this rank: receives still waiting fail now (UCS_ERR_CANCELED), so
  // that an irecv nobody will match does not hold the end for the timeout.
  void cancel_pending() {
    const std::lock_guard lock(mu_);
    for (const auto& w : tracked_)
      if (const auto op = w.lock(); op && !op->done && op->req != nullptr) ::ucp_request_cancel(worker_, op->req);
    tracked_.clear();
  }

  // Waits until every op has completed; on a failure or at the deadline, cancels the rest and
  // throws naming the peer and `what` (the operation).
  void wait(std::span<Op> ops, Clock::time_point deadline, std::string_view what) {
    const auto start = Clock::now();
    bool shared = cpus_shared();
    for (std::uint64_t turn = 0;; ++turn) {
      bool pending = false;
      const Op* failed = nullptr;
      int late_peer = -1;
      bool late_recv = false;
      {
        const std::lock_guard lock(mu_);
        while (::ucp_worker_progress(worker_) != 0) {
        }
        if (lanes_) lanes_->progress();
        for (auto& op : ops) {
          if (!op.done) collect(op);
          // A receive is the worker's, not the endpoint's: UCX fails it for no peer's death.
          // Ours are each from one peer, so a dead peer's endpoint fails them here. Not a
          // lane's: a peer that sent its last bytes and left closes its endpoint while they
          // may still wait in our socket, and the lane sees a real loss itself.
          if (!op.done && !op.lane && failed_[static_cast<std::size_t>(op.peer)] != UCS_OK && failed == nullptr)
            failed = &op;
          else if (!op.done) pending = true;
          else if (op.status != UCS_OK && failed == nullptr) failed = &op;
        }
        if (pending && failed == nullptr && Clock::now() >= deadline) {
          const auto late = std::find_if(ops.begin(), ops.end(), [](const Op& op) { return !op.done; });
          late_peer = late->peer;
          late_recv = late->recv;
        }
        if (failed != nullptr || late_peer >= 0) cancel(ops);
        // Whatever else this rank queued on lanes (the ring's sends to its other neighbour)
        // would be out of step, and would read the caller's buffers after the call returned.
        // A point-to-point receive of the wrong length leaves the ranks in step (recv drained
        // it): not that. A collective's leaves the group broken, and the ring's sends queued to
        // its other neighbour must fail that neighbour at once, not at its deadline.
        const bool in_step = failed != nullptr && !failed->lane && !failed->exact &&
                             failed->status == UCS_ERR_MESSAGE_TRUNCATED;
        if (lanes_ && (failed != nullptr || late_peer >= 0) && !in_step)
          lanes_->break_pending("a collective failed part way on this rank");
      }
      if (failed != nullptr) fail(*failed, what);
      if (!pending) return;
      if (late_peer >= 0)
        throw TimeoutFailure("ucx: " + std::string(what) + ": no answer from " + who(late_peer) +
                             " within the deadline (" + (late_recv ? "receiving from" : "sending to") +
                             " it): stopped, hung, or unreachable from here?");
      const auto now = Clock::now();
      // Spin first (a collective's answer comes in microseconds), then give the core away:
      // a rank waiting minutes for a stalled peer must not keep one busy. Where the cpus are
      // shared (common/cpus_shared.hpp), yield at every turn: the peer may need this core.
      const auto waited = now - start;
      if ((turn & 63) == 63) shared = cpus_shared();
      if (waited > std::chrono::milliseconds(200)) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (shared || waited > std::chrono::milliseconds(2) || (turn & 63) == 63) ::sched_yield();
    }
  }

 private:
  struct Slot {
    Comm* comm;
    int peer;
  };

  static void on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* slot = static_cast<Slot*>(arg);
    slot->comm->failed_[static_cast<std::size_t>(slot->peer)] = status;  // called under mu_ (progress)
  }

  void settle(Op& op, ucs_status_ptr_t ptr) {
    if (ptr == nullptr) {
      op.done = true;
    } else if (UCS_PTR_IS_ERR(ptr)) {
      op.done = true;
      op.status = UCS_PTR_STATUS(ptr);
    } else {
      op.req = ptr;
    }
  }

  // A collective's message between hosts over TCP (tcp_lanes.hpp); the peer is the message's
  // sender for a receive (the tag carries it), so both sides decide alike.
  bool on_lane(std::size_t bytes, int peer, std::uint64_t tag) const {
    return lanes_ && tag >> 56 == kCollectiveKind && bytes >= lanes_from_ && lanes_->to(peer);
  }

  void collect(Op& op) {
    if (op.lane) {
      using State = TcpLanes::State;
      switch (op.lane->state) {
        case State::kPending: return;
        case State::kDone: op.status = UCS_OK; break;
        case State::kLost:
          op.status = UCS_ERR_CONNECTION_RESET;
          failed_[static_cast<std::size_t>(op.peer)] = UCS_ERR_CONNECTION_RESET;  // its UCX receives too
          if (lost_why_[static_cast<std::size_t>(op.peer)].empty())
            lost_why_[static_cast<std::size_t>(op.peer)] = op.lane->why;
          break;
        case State::kMismatch: op.status = UCS_ERR_MESSAGE_TRUNCATED; break;
        case State::kBroken: op.status = UCS_ERR_IO_ERROR; break;
      }
      op.done = true;
      return;
    }
    const auto status = ::ucp_request_check_status(op.req);
    if (status == UCS_INPROGRESS) return;
    if (op.recv) {
      ucp_tag_recv_info_t info{};
      if (::ucp_tag_recv_request_test(op.req, &info) != UCS_INPROGRESS) op.length = info.length;
    }
    op.status = status;
    op.done = true;
    ::ucp_request_free(op.req);
    op.req = nullptr;
    check_length(op);
  }

  // A collective's short message is an error, raised as a truncated one is.
  static void check_length(Op& op) {
    if (!op.done || !op.exact || op.status != UCS_OK || op.length == op.posted) return;
    op.status = UCS_ERR_MESSAGE_TRUNCATED;
    op.came_short = true;
  }

  // Under mu_. A cancelled receive is never written to afterwards; a send to a dead or
  // silent peer is released when UCX gives up on it (ucp_request_free on one in flight).
  void cancel(std::span<Op> ops) {
    for (auto& op : ops) {
      if (op.done || !op.lane) continue;
      lanes_->abandon(op.lane, op.peer);
      op.done = true;
      op.status = UCS_ERR_CANCELED;
    }
    for (auto& op : ops) {
      if (op.done) continue;
      ::ucp_request_cancel(worker_, op.req);
    }
    ::ucp_worker_progress(worker_);
    for (auto& op : ops) {
      if (op.done) continue;
      collect(op);
      if (op.done) continue;
      ::ucp_request_free(op.req);
      op.req = nullptr;
      op.done = true;
      op.status = UCS_ERR_CANCELED;
    }
  }

  [[noreturn]] void fail(const Op& op, std::string_view what) {
    // A transfer given up for its peer's loss: the loss is the news. Read under the lock:
    // another thread's wait may be recording it.
    std::string lost;
    {
      const std::lock_guard lock(mu_);
      lost = lost_why_[static_cast<std::size_t>(op.peer)];
    }
    if (!lost.empty())
      throw std::runtime_error("ucx: " + std::string(what) + ": TCP connection to " + who(op.peer) + " lost (" + lost +
                               "): did it exit, crash or call finalize()?");
    if (op.lane && op.lane->state == TcpLanes::State::kBroken)
      throw std::runtime_error("ucx: " + std::string(what) + ": the TCP lane to " + who(op.peer) + " is out of step (" +
                               op.lane->why + "): this group cannot carry collectives of " +
                               std::to_string(lanes_from_) +
                               " bytes or more any more; make the group (or the job) again, or set "
                               "IDIST_UCX_TCP_FROM=off");
    if (op.lane && op.lane->state == TcpLanes::State::kMismatch)
      throw std::runtime_error("ucx: " + std::string(what) + ": from " + who(op.peer) + ", " + op.lane->why +
                               ": the ranks called different collectives or sizes");
    const auto status = failed_[static_cast<std::size_t>(op.peer)] != UCS_OK ? failed_[static_cast<std::size_t>(op.peer)]
                                                                              : op.status;
    if (status == UCS_ERR_CANCELED)
      throw std::runtime_error("ucx: " + std::string(what) + " from " + who(op.peer) +
                               " cancelled: this rank's group ended (finalize) with the transfer unmatched");
    if (op.came_short)
      throw std::runtime_error("ucx: " + std::string(what) + ": from " + who(op.peer) + ", " + std::to_string(op.length) +
                               " bytes came where " + std::to_string(op.posted) +
                               " were expected: the ranks called different collectives or sizes");
    if (status == UCS_ERR_MESSAGE_TRUNCATED)
      throw std::runtime_error("ucx: " + std::string(what) + ": " + who(op.peer) +
                               " sent more than this rank expected: the ranks called different collectives or sizes");
    throw std::runtime_error("ucx: " + std::string(what) + ": connection to " + who(op.peer) + " lost (" +
                             ::ucs_status_string(status) + "): did it exit, crash or call finalize()?");
  }

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

// Block i of n over `count` elements: offsets and lengths, in elements.
struct Blocks {
  std::size_t count;
  int n;
  std::size_t offset(int i) const {
    const auto base = count / static_cast<std::size_t>(n), extra = count % static_cast<std::size_t>(n);
    const auto u = static_cast<std::size_t>(i);
    return u * base + std::min(u, extra);
  }
  std::size_t length(int i) const {
    return count / static_cast<std::size_t>(n) + (static_cast<std::size_t>(i) < count % static_cast<std::size_t>(n) ? 1 : 0);
  }
};

class UcxBackend final : public Backend {
 public:
  UcxBackend(const BackendInit& init, std::shared_ptr<Context> context)
      : timeout_(init.timeout),
        ring_from_(init.contract.tuning.ucx_ring_from.value_or(kRingFrom)),
        context_(context),
        comm_(std::make_shared<Comm>(init, std::move(context))) {
    const auto deadline = Clock::now() + init.timeout;
    comm_->connect(init.store, init.key_prefix + "ucx/", init.contract, deadline);
    // Every member reached once, so that a peer that cannot be reached says so here, at
    // creation, within the timeout, rather than in the first collective.
    barrier_until(deadline, "connecting");
  }

  std::string_view name() const override { return "ucx"; }

  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    return std::make_unique<UcxBackend>(group.init, context_);
  }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    const auto deadline = call_deadline(timeout_);
    const auto tag = next_tag();
    const auto fn = reduce_kernel(dtype, op);
    const auto bytes = count * dtype_size(dtype);
    if (bytes < ring_from_ || count < static_cast<std::size_t>(size()))
      recursive_doubling(static_cast<char*>(data), bytes, fn, dtype, tag, deadline);
    else {
      ring_reduce_scatter(static_cast<char*>(data), Blocks{count, size()}, dtype, fn, 0, tag, deadline, "all_reduce");
      ring_all_gather(static_cast<char*>(data), Blocks{count, size()}, dtype, 0, tag, deadline, "all_reduce");
    }
  }

  // Binomial tree towards the root; a non-root rank reduces into scratch, so its buffer stays.
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    const auto deadline = call_deadline(timeout_);
    const auto tag = next_tag();
    const auto fn = reduce_kernel(dtype, op);
    const auto bytes = count * dtype_size(dtype);
    const int n = size(), me = rank();
    char* acc = static_cast<char*>(data);
    if (me != root) {
      acc = scratch(acc_, bytes);
      std::memcpy(acc, data, bytes);
    }
    char* tmp = scratch(tmp_, bytes);
    const int v = (me - root + n) % n;
    for (int mask = 1; mask < n; mask <<= 1) {
      if (v & mask) {
        Op s = comm_->send(acc, bytes, (v - mask + root) % n, tag);
        comm_->wait({&s, 1}, deadline, "reduce");
        break;
      }
      if (v + mask < n) {
        const int child = (v + mask + root) % n;
        Op r = comm_->recv(tmp, bytes, child, from(tag, child));
        comm_->wait({&r, 1}, deadline, "reduce");
        fn(acc, acc, tmp, count);
      }
    }
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    const auto block = count * dtype_size(dtype);
    const auto n = static_cast<std::size_t>(size());
    char* all = scratch(rs_, block * n);
    std::memcpy(all, in, block * n);
    if (block * n < ring_from_) {
      all_reduce(all, count * n, dtype, op);
    } else {
      const auto deadline = call_deadline(timeout_);
      // shift -1: the block this rank ends with is its own.
      ring_reduce_scatter(all, Blocks{count * n, size()}, dtype, reduce_kernel(dtype, op), -1, next_tag(), deadline,
                          "reduce_scatter");
    }
    std::memcpy(out, all + block * static_cast<std::size_t>(rank()), block);
  }

  // Every block straight to every peer: as many bytes leave each rank as on a ring, in one
  // round instead of n-1.
  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    std::vector<std::size_t> sizes(static_cast<std::size_t>(size()), bytes_per_rank);
    exchange(in, out, sizes, "all_gather");
  }
  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    exchange(in, out, bytes_per_rank, "all_gather_v");
  }

  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    const auto deadline = call_deadline(timeout_);
    const auto tag = next_tag();
    std::vector<Op> ops;
    if (rank() == root) {
      for (int r = 0; r < size(); ++r)
        if (r != root) ops.push_back(comm_->recv(static_cast<char*>(out) + bytes_per_rank * static_cast<std::size_t>(r),
                                                 bytes_per_rank, r, from(tag, r)));
      std::memmove(static_cast<char*>(out) + bytes_per_rank * static_cast<std::size_t>(root), in, bytes_per_rank);
    } else {
      ops.push_back(comm_->send(in, bytes_per_rank, root, tag));
    }
    comm_->wait(ops, deadline, "gather");
  }

  void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    const auto deadline = call_deadline(timeout_);
    const auto tag = next_tag();
    std::vector<Op> ops;
    if (rank() == root) {
      for (int r = 0; r < size(); ++r)
        if (r != root) ops.push_back(comm_->send(static_cast<const char*>(in) + bytes_per_rank * static_cast<std::size_t>(r),
                                                 bytes_per_rank, r, tag));
      std::memmove(out, static_cast<const char*>(in) + bytes_per_rank * static_cast<std::size_t>(root), bytes_per_rank);
    } else {
      ops.push_back(comm_->recv(out, bytes_per_rank, root, from(tag, root)));
    }
    comm_->wait(ops, deadline, "scatter");
  }

  // Binomial tree from src.
  void broadcast(void* data, std::size_t bytes, int src) override {
    const auto deadline = call_deadline(timeout_);
    const auto tag = next_tag();
    const int n = size();
    const int v = (rank() - src + n) % n;
    int mask = 1;
    for (; mask < n; mask <<= 1) {
      if (v & mask) {
        const int parent = (v - mask + src) % n;
        Op r = comm_->recv(data, bytes, parent, from(tag, parent));
        comm_->wait({&r, 1}, deadline, "broadcast");
        break;
      }
    }
    std::vector<Op> ops;
    for (mask >>= 1; mask > 0; mask >>= 1)
      if (v + mask < n) ops.push_back(comm_->send(data, bytes, (v + mask + src) % n, tag));
    comm_->wait(ops, deadline, "broadcast");
  }

  void barrier() override { barrier_until(call_deadline(timeout_), "barrier"); }

  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) override {
    auto op = std::make_shared<Op>(comm_->send(data, bytes, dst, make_tag(kP2pKind, rank(), tag)));
    return [comm = comm_, op, timeout = timeout_] {
      comm->wait({op.get(), 1}, Clock::now() + timeout, "send");
    };
  }

  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) override {
    auto op = std::make_shared<Op>(comm_->recv(data, bytes, src, make_tag(kP2pKind, src, tag)));
    comm_->track(op);
    return [comm = comm_, op, bytes, src, tag, timeout = timeout_] {
      try {
        comm->wait({op.get(), 1}, Clock::now() + timeout, "recv");
      } catch (const std::runtime_error&) {
        // A longer message than the buffer: UCX has consumed it (truncated), so the ranks
        // are still in step, as on gloo.
        if (op->status != UCS_ERR_MESSAGE_TRUNCATED) throw;
      }
      if (op->status == UCS_ERR_MESSAGE_TRUNCATED || op->length != bytes)
        throw InStepError(comm->who(src) + " sent " +
                          (op->length > bytes || op->status != UCS_ERR_MESSAGE_TRUNCATED ? std::to_string(op->length)
                                                                                         : "more") +
                          " bytes (tag " + std::to_string(tag) + ") but the receive buffer holds " +
                          std::to_string(bytes) + "; pass a buffer of the sender's length");
    };
  }

 private:
  void cancel_transfers() override { comm_->cancel_pending(); }

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }

  std::uint64_t next_tag() { return make_tag(kCollectiveKind, rank(), sequence_++); }
  // The receive side of a collective's tag: the sender's rank in the middle.
  static std::uint64_t from(std::uint64_t tag, int sender) {
    return (tag & ~(std::uint64_t{0xffffff} << 32)) | (static_cast<std::uint64_t>(sender) & 0xffffffu) << 32;
  }

  // Dissemination: ceil(log2 n) rounds of empty messages.
  void barrier_until(Clock::time_point deadline, std::string_view what) {
    const auto tag = next_tag();
    const int n = size(), me = rank();
    for (int k = 1; k < n; k <<= 1) {
      Op ops[] = {comm_->recv(nullptr, 0, (me - k + n) % n, from(tag, (me - k + n) % n)),
                  comm_->send(nullptr, 0, (me + k) % n, tag)};
      comm_->wait(ops, deadline, what);
    }
  }

  // Rabenseifner's small-message half: ranks past the largest power of two p fold into a
  // partner first. Each pair reduces (lower ranks' data, higher ranks' data) in that order,
  // so every rank computes the same bits.
  void recursive_doubling(char* data, std::size_t bytes, ReduceFn fn, DType dtype, std::uint64_t tag,
                          Clock::time_point deadline) {
    const auto count = bytes / dtype_size(dtype);
    const int n = size(), me = rank();
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int rem = n - p;
    char* tmp = scratch(tmp_, bytes);
    int v = me - rem;
    if (me < 2 * rem) {
      if (me % 2 == 0) {
        Op s = comm_->send(data, bytes, me + 1, tag);
        comm_->wait({&s, 1}, deadline, "all_reduce");
        v = -1;
      } else {
        Op r = comm_->recv(tmp, bytes, me - 1, from(tag, me - 1));
        comm_->wait({&r, 1}, deadline, "all_reduce");
        fn(data, tmp, data, count);
        v = me / 2;
      }
    }
    if (v >= 0) {
      for (int mask = 1; mask < p; mask <<= 1) {
        const int pv = v ^ mask;
        const int peer = pv < rem ? pv * 2 + 1 : pv + rem;
        Op ops[] = {comm_->recv(tmp, bytes, peer, from(tag, peer)), comm_->send(data, bytes, peer, tag)};
        comm_->wait(ops, deadline, "all_reduce");
        if (pv < v) fn(data, tmp, data, count);
        else fn(data, data, tmp, count);
      }
    }
    if (me < 2 * rem) {
      if (me % 2 == 1) {
        Op s = comm_->send(data, bytes, me - 1, tag);
        comm_->wait({&s, 1}, deadline, "all_reduce");
      } else {
        Op r = comm_->recv(data, bytes, me + 1, from(tag, me + 1));
        comm_->wait({&r, 1}, deadline, "all_reduce");
      }
    }
  }

  // Ring reduce-scatter over n blocks: at step s this rank sends block (me - s + shift) to the
  // right and reduces block (me - s - 1 + shift) from the left into its own, segment by
  // segment, each reduced segment going on to the right at once (the pipeline). It ends
  // holding block (me + 1 + shift) reduced over every rank.
  void ring_reduce_scatter(char* data, Blocks blocks, DType dtype, ReduceFn fn, int shift, std::uint64_t tag,
                           Clock::time_point deadline, std::string_view what) {
    const int n = size(), me = rank();
    const int right = (me + 1) % n, left = (me - 1 + n) % n;
    const auto es = dtype_size(dtype);
    const auto seg_elems = std::max<std::size_t>(1, kSegment / es);
    const auto block_at = [&](int s) { return ((me - s + shift) % n + n) % n; };
    char* tmp = scratch(tmp_, blocks.length(0) * es);
    std::vector<Op> sends;
    const auto send_block = [&](int b) {
      for (std::size_t off = 0; off < blocks.length(b); off += seg_elems)
        sends.push_back(comm_->send(data + (blocks.offset(b) + off) * es,
                                    std::min(seg_elems, blocks.length(b) - off) * es, right, tag));
    };
    send_block(block_at(0));
    std::vector<Op> recvs;
    for (int s = 0; s + 1 < n; ++s) {
      const int b = block_at(s + 1);
      recvs.clear();
      for (std::size_t off = 0; off < blocks.length(b); off += seg_elems)
        recvs.push_back(
            comm_->recv(tmp + off * es, std::min(seg_elems, blocks.length(b) - off) * es, left, from(tag, left)));
      std::size_t off = 0;
      for (auto& r : recvs) {
        comm_->wait({&r, 1}, deadline, what);
        const auto len = std::min(seg_elems, blocks.length(b) - off);
        char* at = data + (blocks.offset(b) + off) * es;
        fn(at, tmp + off * es, at, len);
        if (s + 2 < n) sends.push_back(comm_->send(at, len * es, right, tag));
        off += seg_elems;
      }
    }
    comm_->wait(sends, deadline, what);
  }

  // The all-gather half: this rank starts with block (me + 1 + shift) and forwards each
  // block's segments as they arrive.
  void ring_all_gather(char* data, Blocks blocks, DType dtype, int shift, std::uint64_t tag, Clock::time_point deadline,
                       std::string_view what) {
    const int n = size(), me = rank();
    const int right = (me + 1) % n, left = (me - 1 + n) % n;
    const auto es = dtype_size(dtype);
    const auto seg_elems = std::max<std::size_t>(1, kSegment / es);
    const int own = ((me + 1 + shift) % n + n) % n;
    std::vector<Op> sends;
    for (std::size_t off = 0; off < blocks.length(own); off += seg_elems)
      sends.push_back(comm_->send(data + (blocks.offset(own) + off) * es,
                                  std::min(seg_elems, blocks.length(own) - off) * es, right, tag));
    std::vector<Op> recvs;
    for (int s = 0; s + 1 < n; ++s) {
      const int b = ((own - s - 1) % n + n) % n;
      recvs.clear();
      for (std::size_t off = 0; off < blocks.length(b); off += seg_elems)
        recvs.push_back(comm_->recv(data + (blocks.offset(b) + off) * es,
                                    std::min(seg_elems, blocks.length(b) - off) * es, left, from(tag, left)));
      std::size_t off = 0;
      for (auto& r : recvs) {
        comm_->wait({&r, 1}, deadline, what);
        const auto len = std::min(seg_elems, blocks.length(b) - off);
        if (s + 2 < n) sends.push_back(comm_->send(data + (blocks.offset(b) + off) * es, len * es, right, tag));
        off += seg_elems;
      }
    }
    comm_->wait(sends, deadline, what);
  }

  void exchange(const void* in, void* out, std::span<const std::size_t> sizes, std::string_view what) {
    const auto deadline = call_deadline(timeout_);
    const auto tag = next_tag();
    const int n = size(), me = rank();
    std::vector<std::size_t> offsets(static_cast<std::size_t>(n), 0);
    for (int r = 1; r < n; ++r)
      offsets[static_cast<std::size_t>(r)] = offsets[static_cast<std::size_t>(r - 1)] + sizes[static_cast<std::size_t>(r - 1)];
    const auto mine = sizes[static_cast<std::size_t>(me)];
    auto* bytes = static_cast<char*>(out);
    std::vector<Op> ops;
    for (int k = 1; k < n; ++k) {
      const int r = (me - k + n) % n;  // from the nearest on the left first, as a ring would
      if (sizes[static_cast<std::size_t>(r)] > 0)
        ops.push_back(comm_->recv(bytes + offsets[static_cast<std::size_t>(r)], sizes[static_cast<std::size_t>(r)], r,
                                  from(tag, r)));
    }
    for (int k = 1; k < n && mine > 0; ++k) ops.push_back(comm_->send(in, mine, (me + k) % n, tag));
    if (mine > 0) std::memmove(bytes + offsets[static_cast<std::size_t>(me)], in, mine);
    comm_->wait(ops, deadline, what);
  }

  // Kept between calls (common/scratch.hpp).
  static char* scratch(std::vector<char>& buffer, std::size_t bytes) { return grown_scratch(buffer, bytes); }

  std::chrono::milliseconds timeout_;
  std::size_t ring_from_;  // all_reduce by ring from this many bytes
  std::shared_ptr<Context> context_;
  std::shared_ptr<Comm> comm_;
  std::uint32_t sequence_ = 0;
  std::vector<char> tmp_, acc_, rs_;
};

}  // namespace

std::string ucx_probe(const env::Contract& contract) {
  std::string why;
  return shared_context(contract, why) ? std::string() : why;
}

std::unique_ptr<Backend> make_ucx_backend(const BackendInit& init) {
  std::string why;
  auto context = shared_context(init.contract, why);
  if (!context) throw std::runtime_error("ucx: " + why);
  return std::make_unique<UcxBackend>(init, std::move(context));
}

}  // namespace idist::detail

IDIST_BACKEND_PLUGIN_PROBED(ucx, &idist::detail::make_ucx_backend, nullptr, &idist::detail::ucx_probe)
