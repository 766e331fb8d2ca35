// The mpi backend. Every collective is MPI's nonblocking variant, driven by MPI_Test until it
// completes or the timeout passes: MPI's blocking calls wait forever for a rank that never
// arrives, and idist promises a TimeoutError instead. Point-to-point is MPI_Isend/MPI_Irecv
// with the caller's tag; MPI matches same-tag messages in posting order, as Backend requires.
// Every communicator returns errors (MPI_ERRORS_RETURN) rather than aborting, and each error
// code becomes an exception carrying MPI's own text.
//
// Its parts: calls.hpp (MPI's errors and int counts), process.cpp (MPI itself, once per
// process, and this process's place in its world), types.cpp (MPI's types and ops for idist's),
// nbc.hpp (libnbc's algorithms), departures.cpp (a leaver's notice); this file waits, and is
// the Backend.

#include "backends/mpi/mpi_backend.hpp"
#include "backends/plugin.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <stdexcept>
#include <string>

#include "backends/mpi/calls.hpp"
#include "backends/mpi/departures.hpp"
#include "backends/mpi/nbc.hpp"
#include "backends/mpi/process.hpp"
#include "backends/mpi/types.hpp"
#include "idist/common/hash.hpp"
#include "common/duration.hpp"
#include "common/wait.hpp"
#include "in_step_error.hpp"
#include "reduce/kernels.hpp"
#include "reduce/recursive_doubling.hpp"

namespace idist::detail {
namespace {

using namespace mpi;
using Clock = std::chrono::steady_clock;

// --- waiting -----------------------------------------------------------------------------------

// Open MPI advances nonblocking operations only inside MPI calls (it has no progress thread),
// so a waiter must keep calling MPI_Test: at once for 20 us (a yield per test would double a
// short operation's time), yielding for 50 ms (large operations keep streaming), then in
// naps, so that a long wait (a peer still computing, an irecv posted early) does not hold a core.
constexpr BackoffPolicy kTestPolicy{.spin = std::chrono::microseconds(20),
                                    .yield = std::chrono::milliseconds(50),
                                    .nap = std::chrono::microseconds(100)};

// MPI's error code once the requests complete; nullopt when the deadline passes first. Once
// the wait has lasted 10 ms, `lasting` runs every 256 tests (it may throw to end the wait): the
// clock is read only then, so a short call never reads it.
template <class Test, class Lasting>
std::optional<int> wait_with(Test&& test, Clock::time_point deadline, Lasting&& lasting) {
  int code = MPI_SUCCESS;
  std::uint32_t tests = 0;
  std::optional<Clock::time_point> from;
  const bool done = poll_until(
      [&] {
        int flag = 0;
        code = test(&flag);
        if (code != MPI_SUCCESS || flag != 0) return true;
        if ((++tests & 255) == 0) {
          const auto now = Clock::now();
          if (!from) from = now + std::chrono::milliseconds(10);
          if (now >= *from) lasting();
        }
        return false;
      },
      deadline, kTestPolicy);
  if (!done) return std::nullopt;
  return code;
}
template <class Test>
std::optional<int> wait_with(Test&& test, Clock::time_point deadline) {
  return wait_with(std::forward<Test>(test), deadline, [] {});
}

std::optional<int> wait_until(MPI_Request& request, MPI_Status& status, Clock::time_point deadline) {
  return wait_with([&](int* done) { return MPI_Test(&request, done, &status); }, deadline);
}

template <std::size_t N>
std::optional<int> wait_until(std::array<MPI_Request, N>& requests, Clock::time_point deadline) {
  return wait_with(
      [&](int* done) { return MPI_Testall(static_cast<int>(N), requests.data(), done, MPI_STATUSES_IGNORE); },
      deadline);
}

InStepError wrong_size(int src, std::string_view sent, std::uint32_t tag, std::size_t holds) {
  return InStepError(fmt::format(
      "rank {} sent {} bytes (tag {}) but the receive buffer holds {}; pass a buffer of the sender's length", src, sent,
      tag, holds));
}

// A posted transfer; the completion that waits for it may be copied and run on another thread.
struct Pending {
  MPI_Request request = MPI_REQUEST_NULL;
};

// --- the backend -------------------------------------------------------------------------------

class MpiBackend final : public Backend {
 public:
  // Owns `comm` from here on, also when this throws.
  MpiBackend(MPI_Comm comm, std::chrono::milliseconds timeout) : comm_(comm), timeout_(timeout) {
    ++process().backends;
    try {
      check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
      check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
      check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
      // MPI guarantees only 32767; Open MPI allows INT_MAX. Predefined attributes live on the world.
      int* tag_ub = nullptr;
      int found = 0;
      check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &found), "MPI_Comm_get_attr");
      tag_ub_ = found != 0 && tag_ub != nullptr ? *tag_ub : 32767;
      // Our own point-to-point (small all_reduce) on a communicator of its own, where no
      // message of the user's can match it. Nonblocking, so that a rank that never comes is a
      // timeout like any other collective's.
      MPI_Request request = MPI_REQUEST_NULL;
      check(MPI_Comm_idup(comm_, &internal_, &request), "MPI_Comm_idup");
      MPI_Status status;
      const auto code = wait_until(request, status, Clock::now() + timeout_);
      if (!code)
        throw TimeoutFailure(timed_out("MPI_Comm_idup", timeout_, "a rank of this group has not called it"));
      check(*code, "MPI_Comm_idup");
      check(MPI_Comm_set_errhandler(internal_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    } catch (...) {
      release();
      --process().backends;
      throw;
    }
    process().built = true;
  }

  ~MpiBackend() override {
    release();
    --process().backends;
  }

  MpiBackend(const MpiBackend&) = delete;
  MpiBackend& operator=(const MpiBackend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // In finalize(), the others are waited for (their notices), as the store's finalize does,
  // and a member this rank left waiting is told to the runtime; at the program's end, the
  // notices only.
  void cancel_transfers() override {
    announce_departure();
    if (!finalizing()) return;
    if (const auto left = departures_.await_the_others(internal_, size_, calls_, timeout_); !left.empty())
      left_behind(left);
  }

  std::string_view name() const override { return "mpi"; }
  BackendTraits traits() const override {
    return {.skip_group_of_one = false, .device_buffers = false, .max_tag = tag_ub_};
  }

  // MPI_Comm_create_group is collective over the members only, which is what Backend
  // promises. Every member must pass the same tag, yet each rank creates only the groups it
  // belongs to, so a count of calls differs between members; the group's key prefix, which
  // every rank numbers alike, gives one tag per group instead. It has no nonblocking variant:
  // a member that never arrives is waited for indefinitely (mpirun ends the job if it died).
  std::unique_ptr<Backend> make_group(const GroupInit& group) override {
    MPI_Group parent = MPI_GROUP_NULL;
    MPI_Group members = MPI_GROUP_NULL;
    check(MPI_Comm_group(comm_, &parent), "MPI_Comm_group");
    int code = MPI_Group_incl(parent, to_int(group.parent_ranks.size(), "ranks"), group.parent_ranks.data(), &members);
    MPI_Group_free(&parent);
    check(code, "MPI_Group_incl");
    MPI_Comm comm = MPI_COMM_NULL;
    code = MPI_Comm_create_group(comm_, members, group_tag(group.init.key_prefix), &comm);
    MPI_Group_free(&members);
    check(code, "MPI_Comm_create_group");
    auto backend = std::make_unique<MpiBackend>(comm, group.init.timeout);
    if (backend->rank() != group.init.rank || backend->size() != group.init.size)
      throw std::runtime_error(fmt::format("MPI made this rank {} of {} in the new group, but idist expected {} of {}",
                                           backend->rank(), backend->size(), group.init.rank, group.init.size));
    return backend;
  }

  // --- reductions: in place through MPI_IN_PLACE ------------------------------------------

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    if (small_all_reduce(data, count, dtype, op)) return;
    const int n = to_int(count, "elements");
    const auto type = element_type(dtype);
    const auto mpi_op = reduce_op(dtype, op);
    collective("MPI_Iallreduce", [&](MPI_Request* r) {
      return NbcAlgorithms::get().post_allreduce(
          count * dtype_size(dtype), [&] { return MPI_Iallreduce(MPI_IN_PLACE, data, n, type, mpi_op, comm_, r); });
    });
  }

  // Only the root reduces in place; the others only send, so their buffers stay as they were.
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root) override {
    const int n = to_int(count, "elements");
    const auto type = element_type(dtype);
    const auto mpi_op = reduce_op(dtype, op);
    collective("MPI_Ireduce", [&](MPI_Request* r) {
      return rank_ == root ? MPI_Ireduce(MPI_IN_PLACE, data, n, type, mpi_op, root, comm_, r)
                           : MPI_Ireduce(data, nullptr, n, type, mpi_op, root, comm_, r);
    });
  }

  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) override {
    const int n = to_int(count, "elements");
    to_int(count * static_cast<std::size_t>(size_), "elements");
    const auto type = element_type(dtype);
    const auto mpi_op = reduce_op(dtype, op);
    collective("MPI_Ireduce_scatter_block",
               [&](MPI_Request* r) { return MPI_Ireduce_scatter_block(in, out, n, type, mpi_op, comm_, r); });
  }

  // --- data movement, in bytes ----------------------------------------------------------------

  void all_gather(const void* in, void* out, std::size_t bytes_per_rank) override {
    const int n = to_int(bytes_per_rank, "bytes");
    to_int(bytes_per_rank * static_cast<std::size_t>(size_), "bytes");
    collective("MPI_Iallgather",
               [&](MPI_Request* r) { return MPI_Iallgather(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_, r); });
  }

  void all_gather_v(const void* in, void* out, std::span<const std::size_t> bytes_per_rank) override {
    std::vector<int> counts(bytes_per_rank.size());
    std::vector<int> offsets(bytes_per_rank.size());
    std::size_t total = 0;
    for (std::size_t r = 0; r < bytes_per_rank.size(); ++r) {
      counts[r] = to_int(bytes_per_rank[r], "bytes");
      offsets[r] = to_int(total, "bytes");
      total += bytes_per_rank[r];
    }
    to_int(total, "bytes");
    // A rank that contributes nothing may have no buffer at all; MPI still wants an address.
    static const char nothing = 0;
    const int mine = counts[static_cast<std::size_t>(rank_)];
    collective("MPI_Iallgatherv", [&](MPI_Request* r) {
      return MPI_Iallgatherv(mine == 0 ? &nothing : in, mine, MPI_BYTE, out, counts.data(), offsets.data(), MPI_BYTE,
                             comm_, r);
    });
  }

  void gather(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    const int n = to_int(bytes_per_rank, "bytes");
    to_int(bytes_per_rank * static_cast<std::size_t>(size_), "bytes");
    collective("MPI_Igather", [&](MPI_Request* r) {
      return MPI_Igather(in, n, MPI_BYTE, rank_ == root ? out : nullptr, n, MPI_BYTE, root, comm_, r);
    });
  }

  void scatter(const void* in, void* out, std::size_t bytes_per_rank, int root) override {
    const int n = to_int(bytes_per_rank, "bytes");
    to_int(bytes_per_rank * static_cast<std::size_t>(size_), "bytes");
    collective("MPI_Iscatter", [&](MPI_Request* r) {
      return MPI_Iscatter(rank_ == root ? in : nullptr, n, MPI_BYTE, out, n, MPI_BYTE, root, comm_, r);
    });
  }

  void broadcast(void* data, std::size_t bytes, int src) override {
    const int n = to_int(bytes, "bytes");
    collective("MPI_Ibcast", [&](MPI_Request* r) { return MPI_Ibcast(data, n, MPI_BYTE, src, comm_, r); });
  }

  void barrier() override {
    collective("MPI_Ibarrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  // --- point-to-point -------------------------------------------------------------------------

  // A send that times out stays posted: Open MPI cannot cancel sends, and the group is unusable
  // after a timeout anyway.
  Completion send(const void* data, std::size_t bytes, int dst, std::uint32_t tag) override {
    const int n = to_int(bytes, "bytes");
    auto pending = std::make_shared<Pending>();
    check(MPI_Isend(data, n, MPI_BYTE, dst, mpi_tag(tag), comm_, &pending->request), "MPI_Isend");
    return [pending, bytes, dst, tag, timeout = timeout_] {
      MPI_Status status;
      const auto code = wait_until(pending->request, status, Clock::now() + timeout);
      if (!code)
        throw TimeoutFailure(
            timed_out(fmt::format("MPI_Isend of {} bytes to rank {} (tag {})", bytes, dst, tag), timeout,
                      "it has not received them"));
      check(*code, fmt::format("MPI_Isend to rank {} (tag {})", dst, tag));
    };
  }

  // MPI receives a shorter message into the front of the buffer and truncates a longer one
  // (consuming it whole either way, so the channel stays in step); both are the caller's
  // mistake, reported as Backend asks, with the sizes when MPI tells them.
  Completion recv(void* data, std::size_t bytes, int src, std::uint32_t tag) override {
    const int n = to_int(bytes, "bytes");
    auto pending = std::make_shared<Pending>();
    check(MPI_Irecv(data, n, MPI_BYTE, src, mpi_tag(tag), comm_, &pending->request), "MPI_Irecv");
    return [pending, bytes, src, tag, timeout = timeout_] {
      MPI_Status status;
      const auto code = wait_until(pending->request, status, Clock::now() + timeout);
      if (!code) {
        // Withdrawn, so that a late message cannot land in a buffer the caller has given up on.
        MPI_Cancel(&pending->request);
        wait_until(pending->request, status, Clock::now() + std::chrono::seconds(1));
        throw TimeoutFailure(
            timed_out(fmt::format("MPI_Irecv of {} bytes from rank {} (tag {})", bytes, src, tag), timeout,
                      "it has not sent them"));
      }
      // MPI reports a truncation's full size in the status; if it does not, say what is known.
      int received = MPI_UNDEFINED;
      if (error_class(*code) == MPI_ERR_TRUNCATE) {
        MPI_Get_count(&status, MPI_BYTE, &received);
        const bool known = received != MPI_UNDEFINED && static_cast<std::size_t>(received) > bytes;
        throw wrong_size(src, known ? std::to_string(received) : "more than " + std::to_string(bytes), tag, bytes);
      }
      check(*code, fmt::format("MPI_Irecv from rank {} (tag {})", src, tag));
      check(MPI_Get_count(&status, MPI_BYTE, &received), "MPI_Get_count");
      if (static_cast<std::size_t>(received) != bytes) throw wrong_size(src, std::to_string(received), tag, bytes);
    };
  }

 private:
  // Posts a nonblocking collective with `start` and waits for it within the timeout. A
  // collective that times out cannot be cancelled (MPI forbids it): it stays posted, and the
  // caller marks the group unusable.
  template <class Start>
  void collective(std::string_view call, Start&& start) {
    MPI_Request request = MPI_REQUEST_NULL;
    ++calls_;
    check(start(&request), call);
    MPI_Status status;
    const auto code =
        wait_watching([&](int* done) { return MPI_Test(&request, done, &status); }, Clock::now() + timeout_);
    if (!code)
      throw TimeoutFailure(
          timed_out(call, timeout_, "a rank of this group has not called it"));
    check(*code, call);
  }

  // ProcessGroup has checked it against traits().max_tag.
  static int mpi_tag(std::uint32_t tag) { return static_cast<int>(tag); }

  // Stable across processes, unlike std::hash.
  int group_tag(std::string_view key_prefix) const {
    return static_cast<int>(common::fnv1a(key_prefix) % (static_cast<std::uint64_t>(tag_ub_) + 1));
  }

  // --- leaving (departures.hpp) ---------------------------------------------------------------
  void announce_departure() { mpi::Departures::announce(internal_, rank_, size_, calls_, departure_note()); }
  void check_departures() { departures_.check(internal_, rank_, calls_); }

  // wait_with, reading the leave notices once the wait has lasted a moment.
  template <class Test>
  std::optional<int> wait_watching(Test&& test, Clock::time_point deadline) {
    return wait_with(std::forward<Test>(test), deadline, [this] { check_departures(); });
  }

  void release() {
    free_comm(internal_);
    free_comm(comm_);
  }

  // Small all_reduce on a power-of-two group as recursive doubling (reduce/recursive_doubling.hpp)
  // over MPI_Isend/MPI_Irecv: log2(size) exchanges, where libnbc's in-place MPI_Iallreduce is
  // a binomial reduce then a broadcast, twice the rounds (at 2 ranks and 8 B, 1.5 us against
  // the blocking call's 0.4). False where it does not apply.
  bool small_all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
    const auto bytes = count * dtype_size(dtype);
    if (bytes > kSmallAllReduce || (size_ & (size_ - 1)) != 0) return false;
    ++calls_;
    const auto deadline = call_deadline(timeout_);
    const int n = static_cast<int>(bytes);
    recursive_doubling(
        rank_, size_, static_cast<char*>(data), theirs_->bytes, count, reduce_kernel(dtype, op),
        [&](int peer, const char* mine) { small_transfer(peer, mine, nullptr, n, deadline); },
        [&](int peer, char* into) { small_transfer(peer, nullptr, into, n, deadline); },
        [&](int peer, const char* mine, char* into) { small_transfer(peer, mine, into, n, deadline); });
    return true;
  }

  // One step of small_all_reduce on the internal communicator: `mine` sent to peer and peer's
  // received `into`, where given. On failure the posted transfers are withdrawn; one MPI does
  // not let go of in time still lands in theirs_, which lives as long as this backend, never in
  // a dead frame.
  void small_transfer(int peer, const char* mine, char* into, int n, Clock::time_point deadline) {
    std::array<MPI_Request, 2> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    auto withdraw = [&] {
      for (auto& r : requests)
        if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      wait_until(requests, Clock::now() + std::chrono::seconds(1));
    };
    if (into != nullptr) check(MPI_Irecv(into, n, MPI_BYTE, peer, 0, internal_, &requests[0]), "MPI_Irecv");
    if (mine != nullptr) {
      if (const int code = MPI_Isend(mine, n, MPI_BYTE, peer, 0, internal_, &requests[1]); code != MPI_SUCCESS) {
        withdraw();
        check(code, "MPI_Isend");
      }
    }
    std::optional<int> code;
    try {
      code = wait_watching(
          [&](int* done) { return MPI_Testall(2, requests.data(), done, MPI_STATUSES_IGNORE); }, deadline);
    } catch (...) {
      withdraw();  // a peer left: the transfers posted from the caller's buffer go too
      throw;
    }
    if (!code) {
      withdraw();
      throw TimeoutFailure(timed_out("MPI_Allreduce", timeout_, "a rank of this group has not called it"));
    }
    check(*code, "MPI_Allreduce");
  }
  static constexpr std::size_t kSmallAllReduce = 4096;
  struct alignas(std::max_align_t) Block {
    char bytes[kSmallAllReduce];
  };
  std::unique_ptr<Block> theirs_ = std::make_unique<Block>();  // the peer's data, aligned for any dtype

  MPI_Comm comm_;
  MPI_Comm internal_ = MPI_COMM_NULL;
  std::atomic<std::uint64_t> calls_{0};  // collectives begun here, alike on every member
  mpi::Departures departures_;
  std::chrono::milliseconds timeout_;
  int rank_ = 0;
  int size_ = 1;
  int tag_ub_ = 32767;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_backend(const BackendInit& init) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized == 0 || mpi_finalized()) start_mpi();
  int rank = 0;
  int size = 1;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  if (rank != init.rank || size != init.size)
    throw std::runtime_error(
        fmt::format("MPI says rank {} of {} but idist was given rank {} of {}", rank, size, init.rank, init.size));
  // Nonblocking, so that the world's first collective is bounded by the timeout like the rest.
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  check(MPI_Comm_idup(MPI_COMM_WORLD, &comm, &request), "MPI_Comm_idup");
  MPI_Status status;
  const auto code = wait_until(request, status, Clock::now() + init.timeout);
  if (!code)
    throw TimeoutFailure(
        timed_out("MPI_Comm_idup", init.timeout, "a rank has not called it"));
  check(*code, "MPI_Comm_idup");
  return std::make_unique<MpiBackend>(comm, init.timeout);
}

}  // namespace idist::detail

IDIST_BACKEND_PLUGIN(mpi, idist::detail::make_mpi_backend, idist::detail::mpi_layout)

