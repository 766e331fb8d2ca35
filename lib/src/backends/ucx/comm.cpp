// The ucx backend's transport (comm.hpp).

#include "backends/ucx/comm.hpp"

#include <sched.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "common/cpus_shared.hpp"

namespace idist::detail::ucx {
namespace {
constexpr std::uint64_t kFullMask = ~std::uint64_t{0};
}  // namespace

Comm::Comm(const BackendInit& init, std::shared_ptr<Context> context)
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

Comm::~Comm() {
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

void Comm::connect(Store& store, const std::string& prefix, const env::Contract& contract, Clock::time_point deadline) {
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
    const auto peer = read_published(store, prefix, r, deadline, who(r), "did not publish its UCX address in time");
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

Op Comm::send(const void* data, std::size_t bytes, int peer, std::uint64_t tag) {
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

Op Comm::recv(void* data, std::size_t bytes, int peer, std::uint64_t tag) {
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

void Comm::track(const std::shared_ptr<Op>& op) {
  const std::lock_guard lock(mu_);
  std::erase_if(tracked_, [](const std::weak_ptr<Op>& w) { return w.expired(); });
  tracked_.push_back(op);
}

void Comm::cancel_pending() {
  const std::lock_guard lock(mu_);
  for (const auto& w : tracked_)
    if (const auto op = w.lock(); op && !op->done && op->req != nullptr) ::ucp_request_cancel(worker_, op->req);
  tracked_.clear();
}

void Comm::wait(std::span<Op> ops, Clock::time_point deadline, std::string_view what) {
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

void Comm::on_peer_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* slot = static_cast<Slot*>(arg);
  slot->comm->failed_[static_cast<std::size_t>(slot->peer)] = status;  // called under mu_ (progress)
}

void Comm::settle(Op& op, ucs_status_ptr_t ptr) {
  if (ptr == nullptr) {
    op.done = true;
  } else if (UCS_PTR_IS_ERR(ptr)) {
    op.done = true;
    op.status = UCS_PTR_STATUS(ptr);
  } else {
    op.req = ptr;
  }
}

bool Comm::on_lane(std::size_t bytes, int peer, std::uint64_t tag) const {
  return lanes_ && tag >> 56 == kCollectiveKind && bytes >= lanes_from_ && lanes_->to(peer);
}

void Comm::collect(Op& op) {
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

void Comm::check_length(Op& op) {
  if (!op.done || !op.exact || op.status != UCS_OK || op.length == op.posted) return;
  op.status = UCS_ERR_MESSAGE_TRUNCATED;
  op.came_short = true;
}

void Comm::cancel(std::span<Op> ops) {
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

void Comm::fail(const Op& op, std::string_view what) {
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

}  // namespace idist::detail::ucx
