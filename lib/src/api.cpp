// The public free functions: each forwards to the default runtime's world group. Queries
// answer for a world of one before init(), as ignite's do, so rank-agnostic code can ask
// them anywhere; collectives before init() are an error.

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <iostream>

#include "idist/common/host.hpp"
#include "idist/idist.hpp"
#include "backends/hierarchical/hierarchical_backend.hpp"
#include "runtime.hpp"

namespace idist {
namespace {

const env::Contract& contract_or_serial() {
  static const env::Contract serial;
  auto* rt = detail::runtime_if_initialized();
  return rt != nullptr ? rt->contract() : serial;
}

}  // namespace

int get_rank() { return contract_or_serial().rank; }
int get_world_size() { return contract_or_serial().world_size; }
int get_local_rank() { return contract_or_serial().local_rank; }
int get_nproc_per_node() { return contract_or_serial().local_world_size; }
int get_nnodes() { return contract_or_serial().nnodes; }
int get_node_rank() { return contract_or_serial().node_rank; }

std::string backend() {
  auto* rt = detail::runtime_if_initialized();
  return rt != nullptr ? std::string(rt->backend_name()) : std::string();
}

std::string hostname() { return common::host_name("unknown"); }

namespace {
// " (shared memory: every rank on this host)" where another backend carries the chosen one.
std::string transport() {
  auto* rt = detail::runtime_if_initialized();
  // A replacement that has not joined yet has no world to show, and must not join for this.
  if (rt == nullptr || rt->joins_later() || rt->world().backend().name() == rt->backend_name()) return "";
  if (rt->world().backend().name() == "shm") return " (shared memory: every rank on this host)";
  if (rt->world().backend().name() == "hierarchical")
    return " (hierarchical: shared memory within each host, " + detail::leaders_transport(rt->world().backend()) +
           " among one leader per host)";
  return " (carried by " + std::string(rt->world().backend().name()) + ")";
}
}  // namespace

void show_config(std::ostream& out) {
  const auto b = backend();
  out << "idist configuration:\n"
      << "  backend: " << (b.empty() ? "none (not initialized)" : b) << transport() << "\n"
      << "  hostname: " << hostname() << "\n"
      << "  world_size: " << get_world_size() << "\n"
      << "  rank: " << get_rank() << "\n"
      << "  local_rank: " << get_local_rank() << "\n"
      << "  nproc_per_node: " << get_nproc_per_node() << "\n"
      << "  nnodes: " << get_nnodes() << "\n"
      << "  node_rank: " << get_node_rank() << "\n";
}

void show_config() { show_config(std::cout); }

// --- groups ------------------------------------------------------------------------------------

Group new_group(const std::vector<int>& ranks) {
  return detail::GroupAccess::make(detail::runtime("new_group").new_group(ranks));
}

bool Group::is_member() const { return state_ == nullptr || state_->rank >= 0; }
int Group::rank() const { return state_ == nullptr ? get_rank() : state_->rank; }
int Group::size() const { return state_ == nullptr ? get_world_size() : static_cast<int>(state_->ranks.size()); }
std::vector<int> Group::ranks() const {
  if (state_ != nullptr) return state_->ranks;
  std::vector<int> all(static_cast<std::size_t>(get_world_size()));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

namespace detail {

// The site is the one ProcessGroup::site gives a call on that group, also before init() (a
// world of one, no backend yet) and for a rank outside the group.
void refuse(std::string_view op, const std::string& why, const Group& group) {
  ErrorSite site{get_rank(), get_world_size(), std::string(op), backend()};
  if (const auto* state = GroupAccess::state(group)) site.op += " on " + state->description;
  throw Error(std::move(site), why);
}

namespace {

// The process group a call runs on (null for a rank outside the group), and how to turn the
// public API's global ranks into its group ranks.
struct Target {
  ProcessGroup* group;
  const GroupState* state;  // null for the world

  int group_rank(std::string_view op, std::string_view role, int global) const {
    if (state == nullptr) return global;
    const auto it = std::find(state->ranks.begin(), state->ranks.end(), global);
    if (it == state->ranks.end())
      throw Error(group->site(op), std::string(role) + "=" + std::to_string(global) + " is not a member");
    return static_cast<int>(it - state->ranks.begin());
  }
};

// A rank outside the group gets its input back: copied by the backend, which knows whether
// the buffers are host or device memory.
void input_back(void* out, const void* in, std::size_t bytes) {
  runtime("copy").world().backend().copy(out, in, bytes);
}

Target target(std::string_view op, const Group& group) {
  auto& rt = runtime(op);
  const auto* state = GroupAccess::state(group);
  if (state == nullptr) return {&rt.world(), nullptr};
  if (state->runtime_id != rt.id())
    throw Error(rt.world().site(op), state->description + " was made before the last finalize(); make it again");
  return {state->group, state};
}

}  // namespace

int group_size(const Group& group) {
  const auto* state = GroupAccess::state(group);
  if (state == nullptr) return get_world_size();
  return state->rank >= 0 ? static_cast<int>(state->ranks.size()) : 1;
}

void all_reduce(void* data, std::size_t count, DType dtype, const AllReduceOptions& o) {
  if (auto t = target("all_reduce", o.group); t.group) t.group->all_reduce(data, count, dtype, o.op);
}

Work iall_reduce(void* data, std::size_t count, DType dtype, const AllReduceOptions& o) {
  if (auto t = target("all_reduce", o.group); t.group) return t.group->iall_reduce(data, count, dtype, o.op);
  return Work();
}

void reduce(void* data, std::size_t count, DType dtype, const ReduceOptions& o) {
  if (auto t = target("reduce", o.group); t.group)
    t.group->reduce(data, count, dtype, o.op, t.group_rank("reduce", "dst", o.dst));
}

Work ireduce(void* data, std::size_t count, DType dtype, const ReduceOptions& o) {
  if (auto t = target("reduce", o.group); t.group)
    return t.group->ireduce(data, count, dtype, o.op, t.group_rank("reduce", "dst", o.dst));
  return Work();
}

void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, const AllReduceOptions& o) {
  auto t = target("reduce_scatter", o.group);
  if (t.group) return t.group->reduce_scatter(in, out, count, dtype, o.op);
  input_back(out, in, count * dtype_size(dtype));
}

std::vector<std::size_t> all_gather_counts(std::size_t count, DType dtype, const Group& group) {
  if (auto t = target("all_gather", group); t.group) return t.group->all_gather_counts(count, dtype);
  return {count};
}

void all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                  std::size_t element_size, const Group& group) {
  if (auto t = target("all_gather", group); t.group)
    return t.group->all_gather_v(in, count, counts, out, element_size);
  input_back(out, in, count * element_size);
}

void all_gather(const void* in, std::size_t count, DType dtype, void* out, const Group& group) {
  if (auto t = target("all_gather", group); t.group) return t.group->all_gather(in, count, dtype, out);
  input_back(out, in, count * dtype_size(dtype));
}

Work iall_gather(const void* in, std::size_t count, DType dtype, void* out, const Group& group) {
  if (auto t = target("all_gather", group); t.group) return t.group->iall_gather(in, count, dtype, out);
  input_back(out, in, count * dtype_size(dtype));
  return Work();
}

bool gather(const void* in, std::size_t count, DType dtype, void* out, const GatherOptions& o) {
  auto t = target("gather", o.group);
  if (!t.group) {
    input_back(out, in, count * dtype_size(dtype));
    return true;
  }
  const int dst = t.group_rank("gather", "dst", o.dst);
  t.group->gather(in, count, dtype, out, dst);
  return t.group->rank() == dst;
}

void scatter(const void* in, std::size_t in_count, void* out, std::size_t count, DType dtype,
             const ScatterOptions& o) {
  if (auto t = target("scatter", o.group); t.group)
    t.group->scatter(in, in_count, out, count, dtype, t.group_rank("scatter", "src", o.src));
}

void broadcast(void* data, std::size_t count, DType dtype, const BroadcastOptions& o) {
  if (auto t = target("broadcast", o.group); t.group)
    t.group->broadcast(data, count, dtype, t.group_rank("broadcast", "src", o.src), o.safe_mode);
}

Work ibroadcast(void* data, std::size_t count, DType dtype, const BroadcastOptions& o) {
  if (auto t = target("broadcast", o.group); t.group)
    return t.group->ibroadcast(data, count, dtype, t.group_rank("broadcast", "src", o.src));
  return Work();
}

void send(const void* data, std::size_t bytes, int dst, int tag) { runtime("send").world().send(data, bytes, dst, tag); }
void recv(void* data, std::size_t bytes, int src, int tag) { runtime("recv").world().recv(data, bytes, src, tag); }
Work isend(const void* data, std::size_t bytes, int dst, int tag) {
  return runtime("isend").world().isend(data, bytes, dst, tag);
}
Work irecv(void* data, std::size_t bytes, int src, int tag) {
  return runtime("irecv").world().irecv(data, bytes, src, tag);
}

}  // namespace detail

std::vector<std::byte> all_gather(std::span<const std::byte> data, const GroupOptions& options) {
  const auto counts = detail::all_gather_counts(data.size(), DType::uint8, options.group);
  std::vector<std::byte> out(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  detail::all_gather_v(data.data(), data.size(), counts, out.data(), 1, options.group);
  return out;
}

std::vector<std::string> all_gather(const std::string& value, const GroupOptions& options) {
  auto t = detail::target("all_gather", options.group);
  if (!t.group) return {value};
  return t.group->all_gather(value);
}

std::string broadcast(const std::string& value, const BroadcastOptions& options) {
  auto t = detail::target("broadcast", options.group);
  if (!t.group) return value;
  return t.group->broadcast(value, t.group_rank("broadcast", "src", options.src));
}

std::string broadcast(const std::string& value, int src) { return broadcast(value, BroadcastOptions{.src = src}); }

Tensor broadcast(const std::optional<Tensor>& value, const BroadcastOptions& options) {
  auto t = detail::target("broadcast", options.group);
  if (!t.group) {
    if (!value) throw Error(ErrorSite{get_rank(), get_world_size(), "broadcast", backend()}, "no value outside the group");
    return *value;
  }
  return t.group->broadcast(value, t.group_rank("broadcast", "src", options.src));
}

void barrier(const GroupOptions& options) {
  if (auto t = detail::target("barrier", options.group); t.group) t.group->barrier();
}

void monitored_barrier(const MonitoredBarrierOptions& options) {
  auto& rt = detail::runtime("monitored_barrier");
  auto t = detail::target("monitored_barrier", options.group);
  if (!t.group) return;
  rt.monitored_barrier(t.state, options.timeout.value_or(rt.contract().timeout));
}

Work ibarrier(const GroupOptions& options) {
  if (auto t = detail::target("barrier", options.group); t.group) return t.group->ibarrier();
  return Work();
}

}  // namespace idist
