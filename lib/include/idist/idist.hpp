#pragma once
// libidist: ignite.distributed's API, in C++.
//
//   idist::init();                                   // reads the env contract set by idist-run
//   std::vector<int64_t> t = {1 + 2 * r, 2 + 2 * r};
//   idist::all_reduce(t);                            // SUM by default, in place
//   auto all = idist::all_gather(2.0 * r);           // one value per rank, in rank order
//   auto msg = idist::broadcast(std::string("hi"), 0);
//   idist::barrier();
//   idist::finalize();
//
// Ordering contract (as in every collective library): all ranks of a group call the same
// collectives in the same order with matching arguments (same op, dtype and element count,
// same root). Sizes may differ between ranks only for all_gather, and for broadcast in
// safe mode. Gloo does not notice a mismatch and may corrupt data silently: run with
// IDIST_DEBUG=1 to have every collective check first that all ranks agree, naming the rank
// that differs. Calls are not thread-safe: use one thread per rank for collectives.
//
// Roots (src, dst) are global ranks, as in torch.distributed, also within a sub-group;
// results gathered over a group come in group-rank order. A rank outside the group a
// collective is called on gets its input back unchanged (ignite's rule), at no cost.
//
// Buffers are host memory, except with the nccl backend, where a span over device memory
// (std::span<float>(device_ptr, n)) is used in place and host buffers are staged through the GPU.
//
// Errors are idist::Error (idist::TimeoutError when peers do not arrive within IDIST_TIMEOUT),
// and their message starts with "[idist rank r/n] op(backend): ". A refused argument leaves
// the group usable; errors.hpp says which errors do not.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idist/errors.hpp"
#include "idist/export.hpp"
#include "idist/types.hpp"
#include "idist/work.hpp"

namespace idist {

namespace detail {
struct GroupState;
struct GroupAccess;
}

// A set of ranks, made by new_group(); a default-constructed Group is the whole world.
// Handles are cheap to copy; the group belongs to the runtime: after finalize() a handle is
// stale, and using it is an error.
class IDIST_API Group {
 public:
  Group() = default;
  bool is_world() const { return state_ == nullptr; }
  // Whether this rank belongs to the group.
  bool is_member() const;
  // This rank's rank within the group, -1 outside it.
  int rank() const;
  int size() const;
  // The members' global ranks, in group-rank order.
  std::vector<int> ranks() const;

 private:
  friend struct detail::GroupAccess;
  explicit Group(std::shared_ptr<const detail::GroupState> state) : state_(std::move(state)) {}
  std::shared_ptr<const detail::GroupState> state_;
};

namespace detail {
// Throws idist::Error for a call refused at the public edge, with the ranks in step (nothing
// sent, or all of it received), so that the group stays usable. The site is this rank, op
// (" on group [...]" for a sub-group) and the backend: what() reads
// "[idist rank r/n] op(backend): why". The typed templates below, those of helpers.hpp and
// idist::torch refuse through it, rather than with a std exception of their own, so that a
// bad argument raises the same Error as the library's own checks.
[[noreturn]] IDIST_API void refuse(std::string_view op, const std::string& why, const Group& group = {});
}  // namespace detail

// Makes a group of the given global ranks (distinct, in range; the order gives group ranks).
// Every rank of the world calls it, members or not, with the same list, in the same order
// relative to other new_group calls: it is a collective over the world.
IDIST_API Group new_group(const std::vector<int>& ranks);

struct InitOptions {
  // The backend the program asks for: "gloo" (CPU, default), "nccl" or "mpi". IDIST_BACKEND,
  // set by `idist-run --backend`, overrides it (with a one-line notice) so that a program
  // written for GPUs can be smoke-tested on CPU.
  std::string backend = "gloo";
  // Live recovery's opt-in (docs/RECOVERY.md). This rank beats a heartbeat that idist-run
  // watches, so that a frozen rank (SIGSTOP, a process not scheduled; not one under a
  // debugger) is stopped and named within --heartbeat-timeout, and when a rank is lost the
  // survivors keep their processes: a collective raises PeerLostError on every survivor, and
  // reform() connects them as the world that goes on. Without idist-run (or with
  // --recovery off) the loss ends the attempt as it does for any program.
  bool recovery = false;
};

// Reads the env contract (RANK, WORLD_SIZE, ..., see env_contract.hpp), joins the rendezvous
// at MASTER_ADDR:MASTER_PORT (rank 0 hosts it) and connects the backend. With no variable
// set, runs as a world of one. With the mpi backend the world is MPI's (the processes
// mpirun started, with or without idist-run in between), and no store is needed. Throws
// Error naming the variable when the environment is bad.
IDIST_API void init(const InitOptions& options = {});
// Leaves, then waits for every rank to arrive (bounded by the timeout) and tears down. Safe to
// call twice. A rank that leaves while a peer waits for it in a collective it never called
// (the ranks ran different numbers of steps) makes that peer's call fail at once, naming it,
// and raises Error here too: neither ends as if all went well.
IDIST_API void finalize();

// What reform() made of this rank: its place in the world that goes on.
struct ReformResult {
  std::uint64_t generation = 0;  // 1 after the job's first re-form, 2 after its second
  int old_rank = -1;             // this rank before the re-form
  int rank = -1;                 // and after it (get_rank() says it too)
  int world_size = 0;            // after it (get_world_size())
  std::vector<int> lost;         // the ranks of the old world that are gone, in its numbering
  std::vector<int> joined;       // replacements new to the world, in the new numbering
};

// Live recovery (InitOptions::recovery, under idist-run's spawn mode): after a collective
// raised PeerLostError, each survivor calls reform() and goes on in the same process. It ends
// what is left of this world's collectives here, waits (within IDIST_TIMEOUT) for idist-run to
// say which ranks go on, and connects them as a new world, renumbered 0..n-1 in their old
// order, through a store idist-run hosts: the loss of rank 0 costs nothing more. Groups made by
// new_group() before it are gone (make them again). A rank that idist-run left out (it froze,
// was given up, and then ran on) is fenced: it prints one line and exits 75 without returning.
// Throws Error where no recovery is offered (no InitOptions::recovery, or no idist-run).
IDIST_API ReformResult reform();
// Live recovery: true once this rank knows that its world lost a peer (one of its collectives
// raised PeerLostError, or idist-run announced the world that goes on without it) and until
// reform() connects that world: every collective of the old one will raise. A few loads, so
// that long work between collectives can stop early: auto_model checks it at each gradient, so a
// rank computing a step that cannot complete stops at the next parameter, not at the step's end.
IDIST_API bool peer_lost();
// Live recovery with replacements (idist-run --max-restarts N): idist-run started a rank in a
// lost one's place, and it waits to join. The ranks admit it together at a step boundary they
// agree on (idist::Recovery does, through auto_model's buckets) by calling admit_replacements(),
// whose new world then has it (ReformResult::joined).
IDIST_API bool replacement_waiting();
// The re-form that admits them, at a step boundary every rank agreed on (replacement_waiting()
// on any rank, combined in a collective): as reform(), but nobody is lost, so nothing is
// aborted: the old groups stay until the new world is connected.
IDIST_API ReformResult admit_replacements();
// Says to idist-run that this rank admits replacements, at step boundaries, with
// admit_replacements() (idist::Recovery says so for its program): idist-run starts a rank in a
// lost one's place only where every running rank said so. A program that only calls reform()
// leaves it unsaid and goes on with the smaller world, holding no idle replacement. `false`
// takes it back (Recovery's destructor: the loop that admitted them is over). No effect outside
// idist-run.
IDIST_API void will_admit_replacements(bool admits = true);

// True in a rank that idist-run started in a lost one's place, from init() until it has taken
// the job's state from a running rank (idist::Recovery does, then calls
// replacement_caught_up()). auto_model skips its wrap-time collectives there, which the running
// ranks do not call. A replacement's init() returns at once, with the lost rank's place
// (get_rank(), get_world_size()) as a guess, so that its program sets up its data and model while
// the job trains on; it joins at its first collective, reform() or replacement_joined(), waiting there
// until the running ranks admit it at a step boundary, and its place is then the world's.
IDIST_API bool is_replacement();
IDIST_API void replacement_caught_up();
// In a replacement, its place in the world it joined (ReformResult::joined holds its rank,
// old_rank is -1), joining first if it has not; Error elsewhere.
IDIST_API ReformResult replacement_joined();
// Marks the end of a training step (auto_model marks its own, at each backward's end), so that
// a rank that leaves early is named with the steps it ran ("rank 1 called finalize() after 6
// steps"), and for `idist-run --metrics` (the step time). Cheap: a few adds and a clock read.
IDIST_API void mark_step();
IDIST_API bool is_initialized();

IDIST_API int get_rank();
IDIST_API int get_world_size();
IDIST_API int get_local_rank();
IDIST_API int get_nproc_per_node();  // ranks on this node (LOCAL_WORLD_SIZE)
IDIST_API int get_nnodes();
IDIST_API int get_node_rank();
IDIST_API std::string backend();  // "gloo", "mpi", "nccl"
IDIST_API std::string hostname();
// Prints backend, hostname, world size, ranks and node layout, one "key: value" per line.
IDIST_API void show_config(std::ostream& out);
IDIST_API void show_config();

// --- options -------------------------------------------------------------------------------

struct AllReduceOptions {
  ReduceOp op = ReduceOp::SUM;
  Group group{};
};
struct ReduceOptions {
  int dst = 0;  // global rank that receives the result
  ReduceOp op = ReduceOp::SUM;
  Group group{};
};
struct BroadcastOptions {
  int src = 0;  // global rank whose value everyone gets
  // Metadata (dtype and length) travels first. For buffers: a rank whose length or dtype
  // differs from src's makes every rank raise instead of corrupting. The overloads taking
  // std::optional always work this way, since their non-src ranks pass no value at all.
  bool safe_mode = false;
  Group group{};
};
struct GatherOptions {
  int dst = 0;  // global rank that receives
  Group group{};
};
struct ScatterOptions {
  int src = 0;  // global rank that sends
  Group group{};
};
struct GroupOptions {
  Group group{};
};

namespace detail {
// Type-erased entry points behind the templates below; they translate roots to group ranks,
// validate and dispatch. Non-members return at once.
IDIST_API void all_reduce(void* data, std::size_t count, DType dtype, const AllReduceOptions& options);
IDIST_API Work iall_reduce(void* data, std::size_t count, DType dtype, const AllReduceOptions& options);
IDIST_API void reduce(void* data, std::size_t count, DType dtype, const ReduceOptions& options);
IDIST_API Work ireduce(void* data, std::size_t count, DType dtype, const ReduceOptions& options);
IDIST_API void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, const AllReduceOptions& options);
IDIST_API std::vector<std::size_t> all_gather_counts(std::size_t count, DType dtype, const Group& group);
IDIST_API void all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                  std::size_t element_size, const Group& group);
IDIST_API void all_gather(const void* in, std::size_t count, DType dtype, void* out, const Group& group);
IDIST_API Work iall_gather(const void* in, std::size_t count, DType dtype, void* out, const Group& group);
// Returns whether this rank received: it is dst, or outside the group (then out = in).
IDIST_API bool gather(const void* in, std::size_t count, DType dtype, void* out, const GatherOptions& options);
// `in_count` is read on src only, where it must be the group size x `count`.
IDIST_API void scatter(const void* in, std::size_t in_count, void* out, std::size_t count, DType dtype,
             const ScatterOptions& options);
IDIST_API void broadcast(void* data, std::size_t count, DType dtype, const BroadcastOptions& options);
IDIST_API Work ibroadcast(void* data, std::size_t count, DType dtype, const BroadcastOptions& options);
IDIST_API void send(const void* data, std::size_t bytes, int dst, int tag);
IDIST_API void recv(void* data, std::size_t bytes, int src, int tag);
IDIST_API Work isend(const void* data, std::size_t bytes, int dst, int tag);
IDIST_API Work irecv(void* data, std::size_t bytes, int src, int tag);
// The size of `group` as seen from this rank: 1 outside it (a non-member is alone).
IDIST_API int group_size(const Group& group);
}  // namespace detail

// --- all_reduce: every rank ends with op applied across ranks, element-wise. --------------

template <Element T>
void all_reduce(std::span<T> data, const AllReduceOptions& options) {
  detail::all_reduce(data.data(), data.size(), dtype_of<T>, options);
}
template <Element T>
void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::SUM) {
  all_reduce(data, AllReduceOptions{.op = op});
}
template <Element T>
void all_reduce(std::vector<T>& data, const AllReduceOptions& options) {
  all_reduce(std::span<T>(data), options);
}
template <Element T>
void all_reduce(std::vector<T>& data, ReduceOp op = ReduceOp::SUM) {
  all_reduce(std::span<T>(data), AllReduceOptions{.op = op});
}
template <Element T>
[[nodiscard]] T all_reduce(T value, const AllReduceOptions& options) {
  detail::all_reduce(&value, 1, dtype_of<T>, options);
  return value;
}
template <Element T>
[[nodiscard]] T all_reduce(T value, ReduceOp op = ReduceOp::SUM) {
  return all_reduce(value, AllReduceOptions{.op = op});
}
// Async: returns at once; `data` must stay untouched until the Work's wait() returns.
template <Element T>
[[nodiscard]] Work iall_reduce(std::span<T> data, const AllReduceOptions& options = {}) {
  return detail::iall_reduce(data.data(), data.size(), dtype_of<T>, options);
}
template <Element T>
[[nodiscard]] Work iall_reduce(std::vector<T>& data, const AllReduceOptions& options = {}) {
  return iall_reduce(std::span<T>(data), options);
}

// --- reduce: the result lands on dst only; other ranks' buffers are left unchanged. --------

template <Element T>
void reduce(std::span<T> data, const ReduceOptions& options = {}) {
  detail::reduce(data.data(), data.size(), dtype_of<T>, options);
}
template <Element T>
void reduce(std::vector<T>& data, const ReduceOptions& options = {}) {
  reduce(std::span<T>(data), options);
}
// dst gets the reduction; the other ranks get their value back.
template <Element T>
[[nodiscard]] T reduce(T value, const ReduceOptions& options = {}) {
  detail::reduce(&value, 1, dtype_of<T>, options);
  return value;
}
template <Element T>
[[nodiscard]] Work ireduce(std::span<T> data, const ReduceOptions& options = {}) {
  return detail::ireduce(data.data(), data.size(), dtype_of<T>, options);
}

// --- reduce_scatter: in holds group-size blocks of out.size(); rank r ends with the
// reduction of every rank's r-th block. --------------------------------------------------
// Throws idist::Error "reduce_scatter(...): input holds ..." when it does not (the vector
// overload: when in.size() is not a multiple of the group size), before anything is sent.

template <Element T>
void reduce_scatter(std::span<const T> in, std::span<T> out, const AllReduceOptions& options = {}) {
  if (in.size() != out.size() * static_cast<std::size_t>(detail::group_size(options.group)))
    detail::refuse("reduce_scatter",
                   "input holds " + std::to_string(in.size()) + " elements; expected group size x output (" +
                       std::to_string(out.size()) + ")",
                   options.group);
  detail::reduce_scatter(in.data(), out.data(), out.size(), dtype_of<T>, options);
}
template <Element T>
[[nodiscard]] std::vector<T> reduce_scatter(const std::vector<T>& in, const AllReduceOptions& options = {}) {
  const auto n = static_cast<std::size_t>(detail::group_size(options.group));
  if (in.size() % n != 0)
    detail::refuse("reduce_scatter",
                   "input holds " + std::to_string(in.size()) + " elements, not a multiple of the group size " +
                       std::to_string(n),
                   options.group);
  std::vector<T> out(in.size() / n);
  reduce_scatter(std::span<const T>(in), std::span<T>(out), options);
  return out;
}

// --- all_gather: the concatenation of every rank's input, in (group) rank order. ----------
// Inputs may have different lengths on different ranks, zero included.

template <Element T>
[[nodiscard]] std::vector<T> all_gather(std::span<const T> data, const GroupOptions& options = {}) {
  const auto counts = detail::all_gather_counts(data.size(), dtype_of<T>, options.group);
  std::vector<T> out(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  detail::all_gather_v(data.data(), data.size(), counts, out.data(), sizeof(T), options.group);
  return out;
}
template <Element T>
[[nodiscard]] std::vector<T> all_gather(const std::vector<T>& data, const GroupOptions& options = {}) {
  return all_gather(std::span<const T>(data), options);
}
// One value per rank.
template <Element T>
[[nodiscard]] std::vector<T> all_gather(T value, const GroupOptions& options = {}) {
  return all_gather(std::span<const T>(&value, 1), options);
}
// Raw bytes, of any length per rank.
[[nodiscard]] IDIST_API std::vector<std::byte> all_gather(std::span<const std::byte> data, const GroupOptions& options = {});
// One string per rank.
[[nodiscard]] IDIST_API std::vector<std::string> all_gather(const std::string& value, const GroupOptions& options = {});
// Equal lengths, into the caller's buffer: out holds group size x in.size() elements (torch's
// all_gather_into_tensor). Every rank passes the same in.size(), so no lengths travel first:
// one collective per call rather than two, and no allocation, which is what a loop wants.
// Throws idist::Error "all_gather(...): output holds ..." (iall_gather: "iall_gather(...)")
// when out is of another size, before anything is sent.
template <Element T>
void all_gather(std::span<const T> in, std::span<T> out, const GroupOptions& options = {}) {
  if (out.size() != in.size() * static_cast<std::size_t>(detail::group_size(options.group)))
    detail::refuse("all_gather",
                   "output holds " + std::to_string(out.size()) + " elements; expected group size x input (" +
                       std::to_string(in.size()) + ")",
                   options.group);
  detail::all_gather(in.data(), in.size(), dtype_of<T>, out.data(), options.group);
}
// Async, equal lengths: out holds group size x in.size() elements.
template <Element T>
[[nodiscard]] Work iall_gather(std::span<const T> in, std::span<T> out, const GroupOptions& options = {}) {
  if (out.size() != in.size() * static_cast<std::size_t>(detail::group_size(options.group)))
    detail::refuse("iall_gather",
                   "output holds " + std::to_string(out.size()) + " elements; expected group size x input (" +
                       std::to_string(in.size()) + ")",
                   options.group);
  return detail::iall_gather(in.data(), in.size(), dtype_of<T>, out.data(), options.group);
}

// --- gather: as all_gather with equal lengths, but only dst receives (others get {}). -----

template <Element T>
[[nodiscard]] std::vector<T> gather(std::span<const T> data, const GatherOptions& options = {}) {
  std::vector<T> out(data.size() * static_cast<std::size_t>(detail::group_size(options.group)));
  if (!detail::gather(data.data(), data.size(), dtype_of<T>, out.data(), options)) return {};
  return out;
}
template <Element T>
[[nodiscard]] std::vector<T> gather(const std::vector<T>& data, const GatherOptions& options = {}) {
  return gather(std::span<const T>(data), options);
}
template <Element T>
[[nodiscard]] std::vector<T> gather(T value, const GatherOptions& options = {}) {
  return gather(std::span<const T>(&value, 1), options);
}

// --- scatter: src's `in` holds group-size blocks of out.size(); rank r receives block r. ---
// `in` is read on src only (other ranks may pass an empty span).

template <Element T>
void scatter(std::span<const T> in, std::span<T> out, const ScatterOptions& options = {}) {
  detail::scatter(in.data(), in.size(), out.data(), out.size(), dtype_of<T>, options);
}
template <Element T>
void scatter(const std::vector<T>& in, std::vector<T>& out, const ScatterOptions& options = {}) {
  scatter(std::span<const T>(in), std::span<T>(out), options);
}

// --- broadcast: src's value reaches every rank. -------------------------------------------
// For buffers every rank passes src's length (checked first in safe mode).

template <Element T>
void broadcast(std::span<T> data, const BroadcastOptions& options) {
  detail::broadcast(data.data(), data.size(), dtype_of<T>, options);
}
template <Element T>
void broadcast(std::span<T> data, int src = 0) {
  broadcast(data, BroadcastOptions{.src = src});
}
template <Element T>
void broadcast(std::vector<T>& data, const BroadcastOptions& options) {
  broadcast(std::span<T>(data), options);
}
template <Element T>
void broadcast(std::vector<T>& data, int src = 0) {
  broadcast(std::span<T>(data), BroadcastOptions{.src = src});
}
template <Element T>
[[nodiscard]] T broadcast(T value, const BroadcastOptions& options) {
  detail::broadcast(&value, 1, dtype_of<T>, options);
  return value;
}
template <Element T>
[[nodiscard]] T broadcast(T value, int src = 0) {
  return broadcast(value, BroadcastOptions{.src = src});
}
// Strings may differ in length: the length travels first.
[[nodiscard]] IDIST_API std::string broadcast(const std::string& value, const BroadcastOptions& options);
[[nodiscard]] IDIST_API std::string broadcast(const std::string& value, int src = 0);
// ignite's safe_mode: ranks other than src pass std::nullopt, knowing neither the length
// nor (for Tensor) the type; src's metadata travels first. A src without a value makes
// every rank raise. The vector overload throws idist::Error "broadcast(...): src sent D,
// not T" on a rank whose T is not src's element type, once the value has arrived.
[[nodiscard]] IDIST_API Tensor broadcast(const std::optional<Tensor>& value, const BroadcastOptions& options = {});
template <Element T>
[[nodiscard]] std::vector<T> broadcast(const std::optional<std::vector<T>>& value, const BroadcastOptions& options = {}) {
  std::optional<Tensor> t;
  if (value) t = Tensor::of(*value);
  const Tensor got = broadcast(t, options);
  if (got.dtype != dtype_of<T>)
    detail::refuse("broadcast",
                   "src sent " + std::string(to_string(got.dtype)) + ", not " + std::string(to_string(dtype_of<T>)),
                   options.group);
  return got.as<T>();
}
template <Element T>
[[nodiscard]] Work ibroadcast(std::span<T> data, const BroadcastOptions& options = {}) {
  return detail::ibroadcast(data.data(), data.size(), dtype_of<T>, options);
}

// --- barrier: returns once every rank (of the group) has entered it. -----------------------
IDIST_API void barrier(const GroupOptions& options = {});
[[nodiscard]] IDIST_API Work ibarrier(const GroupOptions& options = {});

struct MonitoredBarrierOptions {
  std::optional<std::chrono::milliseconds> timeout;  // default: IDIST_TIMEOUT
  Group group{};
};
// c10d's monitored_barrier: a barrier that, when some ranks do not come within the timeout,
// raises TimeoutError on every rank that did, naming the ones that did not ("ranks 2, 3 did
// not arrive within 10s"). A rank that called finalize() is not waited for: the barrier
// raises at once, saying what it did ("rank 2 called finalize() after 6 steps"), and that
// rank's finalize() raises too. Rank 0 of the group collects the arrivals in the rendezvous
// store; slower than barrier(), for finding where a job hangs. With the mpi backend (no
// store) it is a plain barrier.
IDIST_API void monitored_barrier(const MonitoredBarrierOptions& options = {});

// --- point-to-point: one rank's buffer to another's (global ranks). ------------------------
// The receiver passes a buffer of the sender's length. Between two ranks, transfers with the
// same tag (>= 0) arrive in the order they were sent. send/recv block; isend/irecv return a
// Work at once, and the buffer must stay untouched until its wait() returns.

template <Element T>
void send(std::span<const T> data, int dst, int tag = 0) {
  detail::send(data.data(), data.size_bytes(), dst, tag);
}
template <Element T>
void send(const std::vector<T>& data, int dst, int tag = 0) {
  send(std::span<const T>(data), dst, tag);
}
template <Element T>
void recv(std::span<T> data, int src, int tag = 0) {
  detail::recv(data.data(), data.size_bytes(), src, tag);
}
template <Element T>
void recv(std::vector<T>& data, int src, int tag = 0) {
  recv(std::span<T>(data), src, tag);
}
template <Element T>
[[nodiscard]] Work isend(std::span<const T> data, int dst, int tag = 0) {
  return detail::isend(data.data(), data.size_bytes(), dst, tag);
}
template <Element T>
[[nodiscard]] Work isend(const std::vector<T>& data, int dst, int tag = 0) {
  return isend(std::span<const T>(data), dst, tag);
}
template <Element T>
[[nodiscard]] Work irecv(std::span<T> data, int src, int tag = 0) {
  return detail::irecv(data.data(), data.size_bytes(), src, tag);
}
template <Element T>
[[nodiscard]] Work irecv(std::vector<T>& data, int src, int tag = 0) {
  return irecv(std::span<T>(data), src, tag);
}

}  // namespace idist
