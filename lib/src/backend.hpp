#pragma once
// The one abstract backend. Implementations live one per folder under backends/ and see only
// type-erased buffers: (void*, count, DType, ReduceOp) or raw bytes. Argument checks, the
// empty-buffer shortcuts, and error wrapping happen once, above them, in ProcessGroup; a
// backend may assume count > 0 for every call, and a group size > 1 unless its traits ask to
// see groups of one (skip_group_of_one = false: MPI and NCCL).
//
// Every operation has a default that throws "backend X does not support Y" (as c10d's do), so
// a backend built for one purpose (shm: the ranks of one host) implements what it can and the
// rest reads as a clear error rather than a missing symbol.
//
// A backend reports failures in three kinds (the protocol of idist/errors.hpp): InStepError
// for a refusal that leaves every rank in step (nothing sent, or what was sent drained), so
// the group stays usable; TimeoutFailure when a deadline passes; any other exception for a
// broken connection. ProcessGroup::run turns them into idist::Error / TimeoutError.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idist/env_contract.hpp"
#include "idist/export.hpp"
#include "idist/types.hpp"
#include "in_step_error.hpp"
#include "store/store.hpp"

namespace idist::detail {

struct BackendInit {
  int rank = 0;
  int size = 1;
  Store& store;              // bootstrap (and, for some backends, out-of-band exchange)
  std::string key_prefix;    // every group bootstraps under its own prefix
  std::chrono::milliseconds timeout;
  const env::Contract& contract;  // backend settings: GLOO_SOCKET_IFNAME, MASTER_ADDR
  // hosts[r]: which host group rank r runs on, numbered densely from 0 in rank order (ranks
  // share memory exactly when their numbers are equal). Empty when unknown (a backend with
  // its own world).
  std::vector<int> hosts = {};
  // How errors name the members: names[r] is the rank member r is known by to the user (a
  // composite's inner groups number their members from 0). Empty: their own index.
  std::vector<int> names = {};
  // Live recovery: set while the backend connects when a newer generation replaced the one it
  // connects (runtime_reform.cpp); a connect wait that sees it raises PeerLostFailure rather
  // than wait for a member that will never come. Read during construction only; null: never.
  const std::atomic<bool>* superseded = nullptr;
};

// The rank errors give member r of a group made from `init`, and the word before it: "rank "
// in the world (and its inner groups), "group rank " in a group made by new_group.
inline int name_of(const BackendInit& init, int r) {
  return init.names.empty() ? r : init.names[static_cast<std::size_t>(r)];
}
inline std::string member_word(const BackendInit& init) {
  return init.key_prefix.find("/group/") == std::string::npos ? "rank " : "group rank ";
}

// What a backend can do, for the layers above to ask instead of comparing names.
struct BackendTraits {
  // Whether ProcessGroup may answer a group of one itself, without calling the backend. MPI
  // and NCCL say no: their group-of-one path is the real code path, which is what a one-GPU
  // machine can test.
  bool skip_group_of_one = true;
  // Whether user buffers may be GPU memory (nccl); the others refuse it before reading it as
  // host memory.
  bool device_buffers = false;
  // The largest point-to-point tag (MPI's MPI_TAG_UB may be as low as 32767).
  int max_tag = std::numeric_limits<int>::max();
  // Whether all_reduce, reduce and reduce_scatter take ReduceOp::AVG (dividing while the data
  // is in cache, or ncclAvg); ProcessGroup sums and divides for the others.
  bool native_avg = false;
  // Whether every collective calls Backend::before_wait() before it can block (shm): the
  // group then defers its bookkeeping there (see before_wait).
  bool runs_before_wait = false;
};

// What a sub-group is made of: its members, as ranks of the parent group, in group-rank order.
// Only members call Backend::make_group; `init` carries the member's group rank and size and
// the group's own key prefix.
struct GroupInit {
  std::vector<int> parent_ranks;
  BackendInit init;
};

// Exported (IDIST_API) for the backend plugins, which derive from it (backends/plugin.hpp).
class IDIST_API Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual BackendTraits traits() const { return {}; }

  // A composite backend chaining calls on inner ones hands them its own deadline, so that the
  // chain waits one timeout, not one per link. Unset (the default), each call starts its own
  // timeout. Collectives only: point-to-point completions keep their own.
  using Clock = std::chrono::steady_clock;
  void set_deadline(std::optional<Clock::time_point> deadline) { deadline_ = deadline; }
  // Copies between user buffers (host or, for device backends, device memory).
  virtual void copy(void* dst, const void* src, std::size_t bytes);

  // A backend for a sub-group of this one, connected among its members only.
  virtual std::unique_ptr<Backend> make_group(const GroupInit& group);

  // Reductions. The (dtype, op) pair has been checked (bitwise ops on integers only); a
  // backend whose library lacks the pair throws InStepError naming it.
  // In place, element-wise over ranks.
  virtual void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op);
  // In place on `root`; the other ranks' buffers stay as they were (the public API promises it).
  virtual void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
  // `in` holds size * count elements; rank r ends with the reduction of every rank's r-th
  // block of `count` elements in `out`.
  virtual void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);

  // Data movement, in bytes.
  // Every rank contributes `bytes_per_rank` bytes; out holds size * bytes_per_rank.
  virtual void all_gather(const void* in, void* out, std::size_t bytes_per_rank);
  // Rank r contributes bytes_per_rank[r] bytes (zero allowed); out holds their sum, in rank order.
  virtual void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank);
  // As all_gather, but only `root` receives (out is ignored elsewhere).
  virtual void gather(const void* in, void* out, std::size_t bytes_per_rank, int root);
  // `root`'s `in` holds size * bytes_per_rank bytes; rank r receives the r-th block in out.
  virtual void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root);
  // In place: src's bytes overwrite everyone else's.
  virtual void broadcast(void* data, std::size_t bytes, int src);
  virtual void barrier();

  // Point-to-point. Posts the transfer now and returns its completion, which blocks until the
  // transfer is done (TimeoutFailure after the timeout) and may run on another thread. Between
  // two ranks, transfers with the same tag match in the order they were posted; the buffer
  // must stay valid until the completion has returned.
  using Completion = std::function<void()>;
  virtual Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag);
  virtual Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag);
  // The group is going away on this rank (finalize): it posts no more transfers. A peer's
  // pending transfer that only this rank could end (its receive, with no send of ours pending;
  // its send, with no receive of ours pending) may fail now rather than at its timeout, and
  // ours when the peer's side ends likewise; a transfer still matched goes on. Otherwise an
  // irecv nobody matches (its Work dropped) holds the group's end, and every rank's finalize,
  // for the whole timeout. gloo has nothing to do: a pending transfer fails when the peer's
  // connection closes.
  virtual void cancel_transfers() {}
  // Ends this rank's part in the group at once, from any thread, with a call in flight or not:
  // every wait here (a collective, a pending transfer) raises PeerLostFailure naming `why`,
  // and so do the peers' waits on this rank (its connections close or its abort shows in
  // shared memory), so that one survivor's abort frees every survivor of a lost peer. After
  // it the group is only destroyed. Live recovery's first step (docs/ARCHITECTURE.md); the
  // transports that cannot (mpi, nccl, ucx) keep this no-op (recovery is to refuse them).
  virtual void abort(const std::string& why) noexcept { (void)why; }

  // Bookkeeping the group hands the next collective (the flight recorder's entry,
  // ProcessGroup::run_body), for a backend whose traits say runs_before_wait. It runs it once,
  // after its own part is posted and before anything can block: an 8 B shared-memory
  // all_reduce is a cache line each way, and stores made before the post wait for it (the
  // post is a full fence), where stores made after it are done while the peers' line travels.
  struct WaitWork {
    void (*run)(void* context) noexcept = nullptr;
    void* context = nullptr;
  };
  void defer_to_wait(WaitWork work) noexcept { wait_work_ = work; }
  // Runs the deferred work if it has not run yet; the group calls it again once the call ends.
  void before_wait() noexcept {
    if (wait_work_.run == nullptr) return;
    const auto work = wait_work_;
    wait_work_.run = nullptr;
    work.run(work.context);
  }

 protected:
  // Throws InStepError "the X backend does not support OP": every rank reaches the same
  // refusal, so the group stays usable.
  [[noreturn]] void unsupported(std::string_view op) const;
  // The deadline of the collective starting now, and the time left to it (at least 1 ms).
  Clock::time_point call_deadline(std::chrono::milliseconds timeout) const {
    return deadline_ ? *deadline_ : Clock::now() + timeout;
  }
  std::chrono::milliseconds call_timeout(std::chrono::milliseconds timeout) const {
    if (!deadline_) return timeout;
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(*deadline_ - Clock::now()));
  }

 private:
  std::optional<Clock::time_point> deadline_;
  WaitWork wait_work_;
};

// What this rank says as it leaves its groups ("called finalize() after 6 steps"), for a
// backend that tells its peers itself (mpi, which has no store); set by finalize().
IDIST_API std::string departure_note();
// Whether this process is in finalize(): a group torn down then is left on purpose, and a
// backend that must tell its peers itself (shm) does so; torn down at the program's end, the
// process's exit tells them (a closed connection, an ended pid) and names it rightly.
IDIST_API bool finalizing();
// A backend without a store (mpi) says here, in finalize(), that a peer was left waiting for
// this rank in a collective ("<its rank>\t<the call>"): finalize() then raises, as with a store.
IDIST_API void left_behind(const std::string& what);

// Where a rank sits, as a backend that brings its own world sees it.
struct Layout {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_rank = 0;
  int nnodes = 1;
};
// MPI brings its own world (the processes mpirun started, with or without idist-run): this
// initializes it and returns its layout. nullopt for backends that bootstrap from the env
// contract and the store.
std::optional<Layout> native_layout(std::string_view name);

// Creates the backend named `name` ("gloo", "mpi", "nccl") for the world, loading its plugin
// for all but gloo; throws std::runtime_error for a backend that is unknown or whose plugin or
// libraries are missing, naming what is. gloo is what make_carrier chooses to carry it
// (backends/carriers.hpp); a carrier named ("shm", "hierarchical", "ucx": the tests) is made
// as it is.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendInit& init);

}  // namespace idist::detail
