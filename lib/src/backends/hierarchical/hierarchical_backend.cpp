// The hierarchical backend: a group spanning hosts, some with several of its ranks.
//
// Three inner backends, made in this order on every member (each creation is collective over
// its own members, so no two members can wait on each other in opposite orders):
//   flat_     gloo over every member: all_gather(_v), gather, scatter and point-to-point across
//             hosts, which a split would only slow down;
//   local_    shm over the members on this host (absent where a host has one member);
//   leaders_  one leader per host, the host's lowest rank (absent on the others, and where
//             there is one host): ucx or gloo, as IDIST_INTERHOST says (make_carrier);
//   own_rail_ where every host has the same number of members, on all but the leaders: the
//             members with this one's index on every host, the same way (the leaders' rail
//             is leaders_ itself).
// The reductions, broadcast and barrier go through local_ and leaders_, so the bytes that
// cross hosts are one host's worth, not one rank's: all_reduce = reduce on each host,
// all_reduce among leaders, broadcast on each host. A large all_reduce on equal hosts goes by
// rails instead (all_reduce_by_rails): each member of a host carries its share across, so the
// work between hosts is not all on one rank's core.
//
// A call hands its deadline to the inner calls it chains (Backend::set_deadline): the chain
// waits one timeout in all.

#include "backends/hierarchical/hierarchical_backend.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "backends/gloo/gloo_backend.hpp"
#include "backends/shm/shm_backend.hpp"
#include "common/scratch.hpp"
#include "in_step_error.hpp"

namespace idist::detail {

bool hierarchical_can_serve(const std::vector<int>& hosts, const env::Contract& contract) {
  if (contract.intranode == "off" || hosts.size() < 2) return false;
  std::vector<int> distinct(hosts);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  return distinct.size() > 1 && distinct.size() < hosts.size();
}

namespace {

// all_reduce from kPipelineFrom times this many bytes runs in segments of it
// (all_reduce_pipelined): with two segments, the thread and the second leaders' call cost about
// what the overlap saves on an unshaped link, and with four still more than it saves where 4
// ranks share 2 cores (2 ranks per fake host, 4 MiB: 2,794 us unpipelined against 3,774 in
// segments, 6 alternating rounds; from 8 MiB the segments win, docs/BENCHMARKS.md).
// IDIST_HIER_SEGMENT (bytes; 0: never) overrides it, to measure it again elsewhere.
constexpr std::size_t kPipelineFrom = 8;
constexpr std::size_t kSegment = 1024 * 1024;
// From 1 MiB, below the segments (2 ranks per fake host, 4 alternating rounds: 1 MiB 409 us by
// rails against 598 by the leaders; from 64 KiB to 512 KiB the leaders as fast or faster).
// IDIST_HIER_RAILS_FROM (bytes; 0: never) overrides it, to measure it again elsewhere.
constexpr std::size_t kRailsFrom = 1024 * 1024;

// A tuning variable's value, where 0 means never: as a size no message reaches.
std::size_t zero_is_never(std::optional<std::size_t> given, std::size_t measured, std::size_t never) {
  const auto value = given.value_or(measured);
  return value == 0 ? never : value;
}

class HierarchicalBackend final : public Backend {
 public:
  HierarchicalBackend(const BackendInit& init, std::unique_ptr<Backend> flat)
      : rank_(init.rank),
        size_(init.size),
        timeout_(init.timeout),
        hosts_(init.hosts),
        flat_(std::move(flat)) {
    const int host = hosts_[static_cast<std::size_t>(rank_)];
    host_count_ = *std::max_element(hosts_.begin(), hosts_.end()) + 1;
    shared_host_ = host_count_ < size_;
    make_local(init, host);
    make_leaders(init, host);
    set_thresholds(init);
    make_own_rail(init, host);
  }

  std::string_view name() const override { return "hierarchical"; }
  const std::string& leaders_via() const { return leaders_via_; }

  // The same choice as for the world, over the new group's own host map; its gloo, where one
  // is made, is a group of flat_.
  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    return make_carrier(group.init, [&] { return flat_->make_group(group); });
  }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    Chain chain(*this);
    all_reduce_chained(data, count, dtype, op);
  }

  // Non-root buffers stay as they were. Other hosts reduce to their leader (into scratch
  // space), whose totals the leaders reduce to the root's host leader; on the root's host the
  // order is the other way round: the leaders first (the root's leader bringing its own data
  // only), then the host's reduce to the root, where the leader brings the others' totals. So
  // the root gets everything from collectives alone, within the one deadline.
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    Chain chain(*this);
    const auto bytes = count * dtype_size(dtype);
    const int root_host = hosts_[static_cast<std::size_t>(root)];
    void* acc = data;
    if (local_rank_ == 0 && rank_ != root) {
      acc = scratch(bytes);
      std::memcpy(acc, data, bytes);
    }
    if (hosts_[static_cast<std::size_t>(rank_)] != root_host) {
      if (local_) local_->reduce(acc, count, dtype, op, 0);
      if (leaders_) leaders_->reduce(acc, count, dtype, op, root_host);
      return;
    }
    if (leaders_) leaders_->reduce(acc, count, dtype, op, root_host);
    if (local_) local_->reduce(acc, count, dtype, op, local_index(root));
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    Chain chain(*this);
    const auto block = count * dtype_size(dtype);
    char* all = scratch(block * static_cast<std::size_t>(size_));
    std::memcpy(all, in, block * static_cast<std::size_t>(size_));
    all_reduce_chained(all, count * static_cast<std::size_t>(size_), dtype, op);
    std::memcpy(out, all + block * static_cast<std::size_t>(rank_), block);
  }

  void broadcast(void* data, std::size_t bytes, int src) override {
    Chain chain(*this);
    const int src_host = hosts_[static_cast<std::size_t>(src)];
    const bool here = hosts_[static_cast<std::size_t>(rank_)] == src_host;
    if (here && local_) local_->broadcast(data, bytes, local_index(src));
    if (leaders_) leaders_->broadcast(data, bytes, src_host);
    if (!here && local_) local_->broadcast(data, bytes, 0);
  }

  void barrier() override {
    Chain chain(*this);
    if (local_) local_->barrier();
    if (leaders_) leaders_->barrier();
    if (local_) local_->barrier();
  }

  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    Chain chain(*this);
    flat_->all_gather(in, out, bytes_per_rank);
  }
  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    Chain chain(*this);
    flat_->all_gather_v(in, out, bytes_per_rank);
  }
  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    Chain chain(*this);
    flat_->gather(in, out, bytes_per_rank, root);
  }
  void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    Chain chain(*this);
    flat_->scatter(in, out, bytes_per_rank, root);
  }

  // Within a host through shared memory, across hosts through gloo. Every transfer between
  // two ranks takes the same path, so same-tag transfers still match in posting order.
  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) override {
    if (same_host(dst)) return local_->send(data, bytes, local_index(dst), tag);
    return flat_->send(data, bytes, dst, tag);
  }
  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) override {
    if (same_host(src)) return local_->recv(data, bytes, local_index(src), tag);
    return flat_->recv(data, bytes, src, tag);
  }
  void cancel_transfers() override {
    if (local_) local_->cancel_transfers();
    if (flat_) flat_->cancel_transfers();
  }
  void abort(const std::string& why) noexcept override {
    for (auto* inner : {flat_.get(), local_.get(), leaders_.get(), own_rail_.get()})
      if (inner != nullptr) inner->abort(why);
  }

 private:
  // The inner backends share this call's deadline while it lasts.
  class Chain {
   public:
    explicit Chain(HierarchicalBackend& self) : self_(self) {
      const auto deadline = self_.call_deadline(self_.timeout_);
      for (auto* inner : self_.inner()) inner->set_deadline(deadline);
    }
    ~Chain() {
      for (auto* inner : self_.inner()) inner->set_deadline(std::nullopt);
    }
    Chain(const Chain&) = delete;
    Chain& operator=(const Chain&) = delete;

   private:
    HierarchicalBackend& self_;
  };

  std::vector<Backend*> inner() const {
    std::vector<Backend*> out{flat_.get()};
    if (local_) out.push_back(local_.get());
    if (leaders_) out.push_back(leaders_.get());
    if (own_rail_) out.push_back(own_rail_.get());
    return out;
  }
  Backend& rail() const { return own_rail_ ? *own_rail_ : *leaders_; }

  // Segments from kPipelineFrom segments' worth, else rails from rails_from_ where hosts are
  // equal, else the leaders: measured, 2 ranks per fake host (docs/BENCHMARKS.md, "by rails").
  void all_reduce_chained(void* data, std::size_t count, DType dtype, ReduceOp op) {
    const auto bytes = count * dtype_size(dtype);
    // Every leader must cut the same segments, whether its own host has other members or not.
    if (host_count_ > 1 && shared_host_ && bytes >= kPipelineFrom * segment_) {
      all_reduce_pipelined(data, count, dtype, op);
      return;
    }
    if (rails_ && bytes >= rails_from_ && count >= local_members_.size()) {
      all_reduce_by_rails(data, count, dtype, op);
      return;
    }
    if (local_) local_->reduce(data, count, dtype, op, 0);
    if (leaders_) leaders_->all_reduce(data, count, dtype, op);
    if (local_) local_->broadcast(data, count * dtype_size(dtype), 0);
  }

  // Each host reduces its members' data block by block, member i getting block i
  // (reduce_scatter); member i all_reduces its block with member i of every other host (its
  // rail); the host then gathers the blocks back. The elements past the last whole block
  // (fewer than a host's members) take the leaders' path. Where 4 ranks shared 2 cores as two
  // fake hosts, the leaders' path ran at half speed whenever the scheduler put both leaders on
  // one core (1 MiB: 906-1,398 us pinned there against 399-497 apart; Open MPI 494-606 either
  // way, docs/BENCHMARKS.md); by rails, every core carries a share whatever the placement.
  void all_reduce_by_rails(void* data, std::size_t count, DType dtype, ReduceOp op) {
    const auto element = dtype_size(dtype);
    const auto members = local_members_.size();
    const std::size_t block = count / members;
    auto* p = static_cast<char*>(data);
    // Not scratch(): reduce_scatter hands us that very buffer as `data`.
    char* mine = grown_scratch(rail_block_, block * element);
    local_->reduce_scatter(p, mine, block, dtype, op);
    rail().all_reduce(mine, block, dtype, op);
    local_->all_gather(mine, p, block * element);
    const std::size_t rest = count - block * members;
    if (rest == 0) return;
    char* tail = p + block * members * element;
    local_->reduce(tail, rest, dtype, op, 0);
    if (leaders_) leaders_->all_reduce(tail, rest, dtype, op);
    local_->broadcast(tail, rest * element, 0);
  }

  // The same three steps in segments, so that the link between hosts does not idle while a
  // host reduces or broadcasts: every member of a host runs the host's reduces of all segments,
  // then their broadcasts (one fixed order, so the host's members agree on it); the leader
  // hands each reduced segment to a thread of its own that all_reduces it among the leaders,
  // and broadcasts a segment once that thread is done with it. On a 1 Gbit/s link this took
  // 2 ranks per host from 82-92% of the line rate to 91-95% (docs/BENCHMARKS.md).
  void all_reduce_pipelined(void* data, std::size_t count, DType dtype, ReduceOp op) {
    const auto element = dtype_size(dtype);
    const std::size_t per = std::max<std::size_t>(1, segment_ / element);
    const std::size_t segments = (count + per - 1) / per;
    auto* p = static_cast<char*>(data);
    auto segment = [&](std::size_t i) { return std::pair{p + i * per * element, std::min(per, count - i * per)}; };
    if (!local_) {  // the host's only member
      for (std::size_t i = 0; i < segments; ++i) leaders_->all_reduce(segment(i).first, segment(i).second, dtype, op);
      return;
    }
    if (local_rank_ != 0) {
      for (std::size_t i = 0; i < segments; ++i) local_->reduce(segment(i).first, segment(i).second, dtype, op, 0);
      for (std::size_t i = 0; i < segments; ++i)
        local_->broadcast(segment(i).first, segment(i).second * element, 0);
      return;
    }
    std::mutex mu;
    std::condition_variable changed;
    std::size_t reduced = 0;  // segments the host has reduced
    std::size_t crossed = 0;  // segments the leaders have all_reduced
    bool stop = false;        // this thread is leaving (done, or failed): the helper stops waiting
    std::exception_ptr failure;
    std::thread across([&] {
      try {
        for (std::size_t i = 0; i < segments; ++i) {
          {
            std::unique_lock lock(mu);
            changed.wait(lock, [&] { return reduced > i || stop; });
            if (stop) return;
          }
          leaders_->all_reduce(segment(i).first, segment(i).second, dtype, op);
          std::lock_guard lock(mu);
          crossed = i + 1;
          changed.notify_all();
        }
      } catch (...) {
        std::lock_guard lock(mu);
        failure = std::current_exception();
        changed.notify_all();
      }
    });
    auto finish = [&] {
      {
        std::lock_guard lock(mu);
        stop = true;
        changed.notify_all();
      }
      across.join();
    };
    try {
      for (std::size_t i = 0; i < segments; ++i) {
        local_->reduce(segment(i).first, segment(i).second, dtype, op, 0);
        std::lock_guard lock(mu);
        reduced = i + 1;
        changed.notify_all();
      }
      for (std::size_t i = 0; i < segments; ++i) {
        {
          std::unique_lock lock(mu);
          changed.wait(lock, [&] { return crossed > i || failure; });
          if (failure) break;
        }
        local_->broadcast(segment(i).first, segment(i).second * element, 0);
      }
    } catch (...) {
      finish();
      throw;
    }
    finish();
    if (failure) std::rethrow_exception(failure);
  }

  // The parts, made in this order on every member (see the top of the file).

  // local_: shm over this host's members, where it has several.
  void make_local(const BackendInit& init, int host) {
    std::vector<int> local_names;
    for (int r = 0; r < size_; ++r) {
      if (hosts_[static_cast<std::size_t>(r)] != host) continue;
      if (r == rank_) local_rank_ = static_cast<int>(local_members_.size());
      local_members_.push_back(r);
      local_names.push_back(name_of(init, r));
    }
    if (local_members_.size() > 1) {
      local_ = make_shm_backend(BackendInit{local_rank_, static_cast<int>(local_members_.size()), init.store,
                                            init.key_prefix + "host/" + std::to_string(host) + "/", init.timeout,
                                            init.contract, std::vector<int>(local_members_.size(), 0), local_names});
    }
  }

  // leaders_: one leader per host, among the leaders; what carries them, told to every member.
  void make_leaders(const BackendInit& init, int host) {
    // Leaders in host order: leader k is host k's lowest rank.
    std::vector<int> leaders;
    std::vector<int> leader_names;
    for (int h = 0; h < host_count_; ++h) {
      const auto first = std::find(hosts_.begin(), hosts_.end(), h);
      if (first == hosts_.end()) throw InStepError("the host map skips host " + std::to_string(h));
      leaders.push_back(static_cast<int>(first - hosts_.begin()));
      leader_names.push_back(name_of(init, leaders.back()));
    }
    if (host_count_ > 1 && local_rank_ == 0) {
      std::vector<int> distinct(static_cast<std::size_t>(host_count_));
      std::iota(distinct.begin(), distinct.end(), 0);
      const GroupInit group{leaders, BackendInit{host, host_count_, init.store, init.key_prefix + "leaders/",
                                                 init.timeout, init.contract, distinct, leader_names}};
      leaders_ = make_carrier(group.init, [&] { return flat_->make_group(group); });
    }
    // Only leaders took part in the choice: each tells its host's other members, for
    // show_config (what a user reads to know which path ran) and for the thresholds below.
    if (host_count_ > 1) {
      const auto key = init.key_prefix + "leaders-via/" + std::to_string(host);
      if (local_rank_ == 0) {
        const auto name = leaders_->name();
        init.store.set(key, std::vector<char>(name.begin(), name.end()));
      }
      const auto value = local_rank_ == 0 ? std::vector<char>(leaders_->name().begin(), leaders_->name().end())
                                          : init.store.get(key);
      leaders_via_.assign(value.begin(), value.end());
    }
  }

  // segment_ and rails_from_: as IDIST_HIER_SEGMENT and IDIST_HIER_RAILS_FROM say, else as
  // measured for what carries the leaders.
  void set_thresholds(const BackendInit& init) {
    // Segments and rails were measured over ucx. Over gloo's TCP they cost more than they save
    // (2 ranks per fake host, 3 alternating rounds: 1 MiB 3,960 us by rails against 1,197
    // without, 8 MiB 14,588 in segments against 12,148 without; docs/BENCHMARKS.md), so there
    // they run only where the variables ask for them.
    const bool measured = leaders_via_ == "ucx";
    // A segment count of kPipelineFrom of the largest segment stays within size_t.
    constexpr auto kLargestSegment = std::numeric_limits<std::size_t>::max() / kPipelineFrom;
    segment_ = std::min(zero_is_never(init.contract.tuning.hier_segment, measured ? kSegment : 0, kLargestSegment),
                        kLargestSegment);
    rails_from_ = zero_is_never(init.contract.tuning.hier_rails_from, measured ? kRailsFrom : 0,
                                std::numeric_limits<std::size_t>::max());
  }

  // own_rail_: member i of each host (in host order) on rail i, where hosts are equal.
  void make_own_rail(const BackendInit& init, int host) {
    // Rails need every host to have as many members as this one; then member i of each host
    // (in host order) joins rail i, made after leaders_ as the rail's own collective.
    const auto per_host = local_members_.size();
    // Not made where IDIST_HIER_RAILS_FROM=0 turned them off (a group of connections for nothing).
    bool equal_hosts = host_count_ > 1 && per_host > 1 && rails_from_ != std::numeric_limits<std::size_t>::max();
    for (int h = 0; h < host_count_ && equal_hosts; ++h)
      equal_hosts = static_cast<std::size_t>(std::count(hosts_.begin(), hosts_.end(), h)) == per_host;
    if (equal_hosts && local_rank_ > 0) {
      std::vector<int> members;
      std::vector<int> names;
      for (int h = 0; h < host_count_; ++h) {
        int seen = 0;
        for (int r = 0; r < size_; ++r)
          if (hosts_[static_cast<std::size_t>(r)] == h && seen++ == local_rank_) {
            members.push_back(r);
            names.push_back(name_of(init, r));
            break;
          }
      }
      std::vector<int> distinct(static_cast<std::size_t>(host_count_));
      std::iota(distinct.begin(), distinct.end(), 0);
      const GroupInit group{members, BackendInit{host, host_count_, init.store,
                                                 init.key_prefix + "rails/" + std::to_string(local_rank_) + "/",
                                                 init.timeout, init.contract, distinct, names}};
      own_rail_ = make_carrier(group.init, [&] { return flat_->make_group(group); });
    }
    rails_ = equal_hosts;
  }

  bool same_host(int r) const {
    return local_ && hosts_[static_cast<std::size_t>(r)] == hosts_[static_cast<std::size_t>(rank_)];
  }
  int local_index(int r) const {
    return static_cast<int>(std::find(local_members_.begin(), local_members_.end(), r) - local_members_.begin());
  }

  // Kept between calls (common/scratch.hpp).
  char* scratch(std::size_t bytes) { return grown_scratch(scratch_, bytes); }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<int> hosts_;
  std::size_t segment_ = 0;     // all_reduce_pipelined's segment (IDIST_HIER_SEGMENT)
  std::size_t rails_from_ = 0;  // all_reduce_by_rails from here (IDIST_HIER_RAILS_FROM); max: never
  std::vector<int> local_members_;  // this host's members, ascending
  int local_rank_ = 0;              // our index among them; 0: the host's leader
  int host_count_ = 1;
  bool shared_host_ = false;        // some host has several members (so segments can overlap)
  std::unique_ptr<Backend> flat_;
  std::unique_ptr<Backend> local_;
  std::unique_ptr<Backend> leaders_;
  std::unique_ptr<Backend> own_rail_;  // a member other than the leader: its rail
  bool rails_ = false;                 // every host has this many members (rails are made)
  std::vector<char> scratch_;
  std::vector<char> rail_block_;  // all_reduce_by_rails' block
  std::string leaders_via_;
};

}  // namespace

std::string leaders_transport(const Backend& backend) {
  const auto* h = dynamic_cast<const HierarchicalBackend*>(&backend);
  return h != nullptr ? h->leaders_via() : std::string();
}

std::unique_ptr<Backend> make_hierarchical_backend(const BackendInit& init, const GlooMaker& flat) {
  if (init.hosts.size() != static_cast<std::size_t>(init.size))
    throw InStepError("the hierarchical backend needs every member's host");
  return std::make_unique<HierarchicalBackend>(init, flat ? flat() : make_gloo_backend(init));
}

}  // namespace idist::detail
