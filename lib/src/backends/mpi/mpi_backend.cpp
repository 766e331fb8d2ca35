// The mpi backend. Every collective is MPI's nonblocking variant, driven by MPI_Test until it
// completes or the timeout passes: MPI's blocking calls wait forever for a rank that never
// arrives, and idist promises a TimeoutError instead. Point-to-point is MPI_Isend/MPI_Irecv
// with the caller's tag; MPI matches same-tag messages in posting order, as Backend requires.
// Every communicator returns errors (MPI_ERRORS_RETURN) rather than aborting, and each error
// code becomes an exception carrying MPI's own text.

#include "backends/mpi/mpi_backend.hpp"
#include "backends/plugin.hpp"

// The C API only: mpi.h would otherwise pull in Open MPI's C++ bindings, which need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <spdlog/fmt/fmt.h>

#include "backends/mpi/departures.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <utility>
#include <stdexcept>
#include <string>
#include <thread>

#include "idist/common/hash.hpp"
#include "common/duration.hpp"
#include "common/wait.hpp"
#include "in_step_error.hpp"
#include "reduce/kernels.hpp"

namespace idist::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

void check(int code, std::string_view call) {
  if (code != MPI_SUCCESS) throw std::runtime_error(fmt::format("{} failed: {}", call, error_text(code)));
}

int error_class(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls;
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// MPI counts in int. Counting in larger units would need derived datatypes, which MPI's
// predefined reduction ops refuse.
int to_int(std::size_t n, std::string_view what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw InStepError(fmt::format("{} {} exceed MPI's limit of {} per call; split the buffer", n, what, INT_MAX));
  return static_cast<int>(n);
}

// --- MPI itself: one per process ---------------------------------------------------------------

// MPI belongs to the process, not to an idist runtime: it starts once and ends once, and only
// the one who started it should end it. This is all idist remembers about it.
struct MpiProcess {
  std::mutex mu;
  bool started_by_us = false;
  std::atomic<int> backends{0};     // built and alive: the program is in the middle of a job
  std::atomic<bool> built{false};   // one was built: with none alive, idist::finalize() ran
  bool own_ops_ready = false;
  MPI_Datatype half_type;  // two opaque bytes: float16 and bfloat16 alike
  MPI_Op half_ops[2][4];   // [float16, bfloat16][SUM, PRODUCT, MIN, MAX]
  MPI_Op float_ops[2][2];  // [float32, float64][MIN, MAX]: a NaN wins, as in our other backends
};

// Never destroyed: the exit hook and a world backend torn down by static destruction may
// both still need it.
MpiProcess& process() {
  static auto* p = new MpiProcess;
  return *p;
}

void end_mpi() {
  if (!mpi_finalized()) MPI_Finalize();
}

// MPI started by idist ends when the process does, not at idist::finalize(): MPI cannot start
// twice in a process, and a program may init and finalize idist more than once (as torch
// finalizes MPI only at exit). A program that failed at init ends MPI here too, so that
// mpirun does not report a process that exited without it. Not on a failing exit in the middle
// of the job (a status other than 0 before idist::finalize()): MPI_Finalize waits for every
// rank, and the others may be waiting in a collective for this one, until their timeout. Left
// unended, the process's exit status reaches mpirun, which ends the job at once and names it.
// Nor on one before any backend was built (an init that failed on this rank alone: the others
// wait for it in theirs). After idist::finalize() it does end MPI, whatever the status: the
// others are finishing too, and one still writing its results must not be killed for this
// one's exit.
void end_mpi_at_exit(int status, void*) {
  auto& p = process();
  if (status != 0 && (p.backends.load() > 0 || !p.built.load())) return;
  std::lock_guard lock(p.mu);
  if (p.started_by_us) end_mpi();
}

// --- user-defined MPI_Ops over our own kernels: every op on the 16-bit floats (MPI has none), ---
// --- MIN and MAX on the others (MPI's keep or drop a NaN by the ranks' order) ----------------

template <DType D, ReduceOp Op>
void reduce_own(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_kernel(D, Op)(inout, inout, in, static_cast<std::size_t>(*len));
}

template <DType D>
constexpr std::array<MPI_User_function*, 4> kHalfFunctions = {
    &reduce_own<D, ReduceOp::SUM>, &reduce_own<D, ReduceOp::PRODUCT>, &reduce_own<D, ReduceOp::MIN>,
    &reduce_own<D, ReduceOp::MAX>};
static_assert(static_cast<int>(ReduceOp::SUM) == 0 && static_cast<int>(ReduceOp::MAX) == 3,
              "half_ops is indexed by ReduceOp");

// Attributes of MPI_COMM_SELF are deleted first thing in MPI_Finalize, whoever calls it (us or
// a program that started MPI itself): the one moment at which freeing MPI objects is still
// legal and certainly last.
int free_own_ops(MPI_Comm, int, void*, void*) {
  auto& p = process();
  for (auto& row : p.half_ops)
    for (auto& op : row) MPI_Op_free(&op);
  for (auto& row : p.float_ops)
    for (auto& op : row) MPI_Op_free(&op);
  MPI_Type_free(&p.half_type);
  p.own_ops_ready = false;
  return MPI_SUCCESS;
}

const MpiProcess& own_ops() {
  auto& p = process();
  std::lock_guard lock(p.mu);
  if (p.own_ops_ready) return p;
  check(MPI_Type_contiguous(2, MPI_BYTE, &p.half_type), "MPI_Type_contiguous");
  check(MPI_Type_commit(&p.half_type), "MPI_Type_commit");
  for (std::size_t op = 0; op < 4; ++op) {
    check(MPI_Op_create(kHalfFunctions<DType::float16>[op], 1, &p.half_ops[0][op]), "MPI_Op_create");
    check(MPI_Op_create(kHalfFunctions<DType::bfloat16>[op], 1, &p.half_ops[1][op]), "MPI_Op_create");
  }
  check(MPI_Op_create(&reduce_own<DType::float32, ReduceOp::MIN>, 1, &p.float_ops[0][0]), "MPI_Op_create");
  check(MPI_Op_create(&reduce_own<DType::float32, ReduceOp::MAX>, 1, &p.float_ops[0][1]), "MPI_Op_create");
  check(MPI_Op_create(&reduce_own<DType::float64, ReduceOp::MIN>, 1, &p.float_ops[1][0]), "MPI_Op_create");
  check(MPI_Op_create(&reduce_own<DType::float64, ReduceOp::MAX>, 1, &p.float_ops[1][1]), "MPI_Op_create");
  int keyval = MPI_KEYVAL_INVALID;
  check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_own_ops, &keyval, nullptr), "MPI_Comm_create_keyval");
  check(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr), "MPI_Comm_set_attr");
  MPI_Comm_free_keyval(&keyval);  // the attribute keeps it alive until it is deleted
  p.own_ops_ready = true;
  return p;
}

// The one switch over dtypes in this backend.
MPI_Datatype element_type(DType dtype) {
  switch (dtype) {
    case DType::int8: return MPI_INT8_T;
    case DType::uint8: return MPI_UINT8_T;
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::float16:
    case DType::bfloat16: return own_ops().half_type;
  }
  throw InStepError("unknown dtype");
}

MPI_Op reduce_op(DType dtype, ReduceOp op) {
  if (dtype == DType::float16 || dtype == DType::bfloat16) {
    if (is_bitwise(op))
      throw InStepError(fmt::format("MPI has no {} on {}", to_string(op), to_string(dtype)));
    return own_ops().half_ops[dtype == DType::float16 ? 0 : 1][static_cast<std::size_t>(op)];
  }
  if ((dtype == DType::float32 || dtype == DType::float64) && (op == ReduceOp::MIN || op == ReduceOp::MAX))
    return own_ops().float_ops[dtype == DType::float32 ? 0 : 1][op == ReduceOp::MIN ? 0 : 1];
  switch (op) {
    case ReduceOp::SUM: return MPI_SUM;
    case ReduceOp::PRODUCT: return MPI_PROD;
    case ReduceOp::MIN: return MPI_MIN;
    case ReduceOp::MAX: return MPI_MAX;
    case ReduceOp::AND: return MPI_BAND;
    case ReduceOp::OR: return MPI_BOR;
    case ReduceOp::XOR: return MPI_BXOR;
    case ReduceOp::AVG: break;  // ProcessGroup reduces with SUM and divides
  }
  throw InStepError("unknown reduce op");
}

// --- libnbc's algorithms -------------------------------------------------------------------------

// idist posts MPI's nonblocking collectives (see "waiting" below), which Open MPI runs in its
// libnbc component rather than in the tuned one behind the blocking calls, and libnbc picks
// its algorithms differently: a binomial allreduce (a reduce, then a broadcast) for every
// in-place call, and a chain for a reduce of 64 KiB and up on at most 4 ranks. Both move twice
// the data the blocking calls move: measured at 2 ranks, 2 to 2.5 times the time of
// MPI_Allreduce and MPI_Reduce from 64 KiB on (docs/BENCHMARKS.md). The choice is an MCA
// variable that the MPI tool interface (MPI_T) may set at run time and that libnbc reads when
// a collective is posted. So idist asks, for an allreduce of 64 KiB and up, for Rabenseifner's
// reduce-scatter + allgather (what the blocking calls use at that size), and keeps libnbc's
// default below, where the binomial tree's fewer rounds win; and for a binomial reduce at
// every size. The choice depends on the size alone, so every rank of a collective runs the
// same schedule, as these variables (scope "all") require. A variable the user set (--mca,
// OMPI_MCA_*, a parameter file) is left as it is, and an MPI without these variables
// (MPICH, ...) is left alone.
class NbcAlgorithms {
 public:
  // After MPI has started.
  static NbcAlgorithms& get() {
    static auto* algorithms = new NbcAlgorithms;  // never destroyed: used until MPI ends
    return *algorithms;
  }

  // Posts an allreduce of `bytes` with `post`, having chosen its algorithm; the lock keeps
  // another idist thread from choosing for its own allreduce in between.
  template <class Post>
  int post_allreduce(std::size_t bytes, Post&& post) {
    if (!allreduce_) return post();
    std::lock_guard lock(mu_);
    const int wanted = bytes >= kLarge ? kRedscatAllgather : kDefault;
    if (wanted != allreduce_value_ && MPI_T_cvar_write(*allreduce_, &wanted) == MPI_SUCCESS) allreduce_value_ = wanted;
    return post();
  }

 private:
  static constexpr std::size_t kLarge = 64 * 1024;  // libnbc's own boundary between small and large
  static constexpr int kDefault = 0;                 // libnbc's "ignore": its own choice
  static constexpr int kBinomial = 2;                // coll_libnbc_ireduce_algorithm
  static constexpr int kRedscatAllgather = 3;        // coll_libnbc_iallreduce_algorithm

  NbcAlgorithms() {
    int provided = 0;
    if (MPI_T_init_thread(MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) return;
    allreduce_ = handle("coll_libnbc_iallreduce_algorithm");
    if (auto reduce = handle("coll_libnbc_ireduce_algorithm")) MPI_T_cvar_write(*reduce, &kBinomial);
  }

  // The variable's handle while it holds libnbc's default and the environment does not name it.
  static std::optional<MPI_T_cvar_handle> handle(const char* name) {
    if (std::getenv(("OMPI_MCA_" + std::string(name)).c_str()) != nullptr) return std::nullopt;
    int index = 0;
    int count = 0;
    MPI_T_cvar_handle h = MPI_T_CVAR_HANDLE_NULL;
    if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS ||
        MPI_T_cvar_handle_alloc(index, nullptr, &h, &count) != MPI_SUCCESS)
      return std::nullopt;
    int value = -1;
    if (count != 1 || MPI_T_cvar_read(h, &value) != MPI_SUCCESS || value != kDefault) {
      MPI_T_cvar_handle_free(&h);
      return std::nullopt;
    }
    return h;
  }

  std::mutex mu_;
  std::optional<MPI_T_cvar_handle> allreduce_;
  int allreduce_value_ = kDefault;
};

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

void free_comm(MPI_Comm& comm) {
  if (comm != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm);
  comm = MPI_COMM_NULL;
}

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
    if (const auto left = departures_.await_the_others(internal_, size_, timeout_); !left.empty())
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

  // Small all_reduce on a power-of-two group as recursive doubling over MPI_Isend/MPI_Irecv:
  // log2(size) exchanges, where libnbc's in-place MPI_Iallreduce is a binomial reduce then a
  // broadcast, twice the rounds (at 2 ranks and 8 B, 1.5 us against the blocking call's 0.4).
  // Each pair combines the lower rank's data first, so every rank computes the same tree and
  // gets the same bits. False where it does not apply.
  bool small_all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
    const auto bytes = count * dtype_size(dtype);
    if (bytes > kSmallAllReduce || (size_ & (size_ - 1)) != 0) return false;
    ++calls_;
    const auto fn = reduce_kernel(dtype, op);
    char* theirs = theirs_->bytes;
    const auto deadline = call_deadline(timeout_);
    const int n = static_cast<int>(bytes);
    for (int mask = 1; mask < size_; mask <<= 1) {
      const int peer = rank_ ^ mask;
      std::array<MPI_Request, 2> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
      // On failure the posted transfers are withdrawn; one MPI does not let go of in time
      // still lands in theirs_, which lives as long as this backend, never in a dead frame.
      auto withdraw = [&] {
        for (auto& r : requests)
          if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
        wait_until(requests, Clock::now() + std::chrono::seconds(1));
      };
      check(MPI_Irecv(theirs, n, MPI_BYTE, peer, 0, internal_, &requests[0]), "MPI_Irecv");
      if (const int code = MPI_Isend(data, n, MPI_BYTE, peer, 0, internal_, &requests[1]); code != MPI_SUCCESS) {
        withdraw();
        check(code, "MPI_Isend");
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
      if (peer < rank_) {
        fn(data, theirs, data, count);
      } else {
        fn(data, data, theirs, count);
      }
    }
    return true;
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

std::string_view thread_level(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
  }
}

// Starts MPI unless someone has; either way it must allow calls from any thread at any time.
void start_mpi() {
  auto& p = process();
  std::lock_guard lock(p.mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (mpi_finalized())
    throw std::runtime_error(
        "MPI has already ended in this process (MPI_Finalize was called), and MPI cannot start twice");
  int provided = MPI_THREAD_SINGLE;
  if (initialized == 0) {
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    p.started_by_us = true;
    ::on_exit(&end_mpi_at_exit, nullptr);  // glibc's atexit that is told the status
    if (provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error(fmt::format(
          "this MPI library provides only {}; the mpi backend needs MPI_THREAD_MULTIPLE", thread_level(provided)));
  } else {
    check(MPI_Query_thread(&provided), "MPI_Query_thread");
    if (provided < MPI_THREAD_MULTIPLE)
      throw std::runtime_error(
          fmt::format("the program started MPI with {}; the mpi backend needs MPI_THREAD_MULTIPLE "
                      "(MPI_Init_thread), or let idist::init() start MPI",
                      thread_level(provided)));
  }
  NbcAlgorithms::get();
}

// Frees a communicator made for a moment, also on the way out of an exception.
struct ScratchComm {
  MPI_Comm comm = MPI_COMM_NULL;
  ~ScratchComm() { free_comm(comm); }
};

}  // namespace

Layout mpi_layout() {
  start_mpi();
  // On a duplicate, whose errors can be made to return; the world's abort the job.
  ScratchComm world;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &world.comm), "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(world.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Layout layout;
  check(MPI_Comm_rank(world.comm, &layout.rank), "MPI_Comm_rank");
  check(MPI_Comm_size(world.comm, &layout.size), "MPI_Comm_size");

  ScratchComm node;
  check(MPI_Comm_split_type(world.comm, MPI_COMM_TYPE_SHARED, layout.rank, MPI_INFO_NULL, &node.comm),
        "MPI_Comm_split_type");
  check(MPI_Comm_rank(node.comm, &layout.local_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(node.comm, &layout.local_size), "MPI_Comm_size");

  // Nodes are numbered by their first rank's world rank: the leaders (local rank 0) get a
  // communicator of their own, in world order, and tell their node where it stands.
  ScratchComm leaders;
  check(MPI_Comm_split(world.comm, layout.local_rank == 0 ? 0 : MPI_UNDEFINED, layout.rank, &leaders.comm),
        "MPI_Comm_split");
  int place[2] = {0, 1};
  if (leaders.comm != MPI_COMM_NULL) {
    check(MPI_Comm_rank(leaders.comm, &place[0]), "MPI_Comm_rank");
    check(MPI_Comm_size(leaders.comm, &place[1]), "MPI_Comm_size");
  }
  check(MPI_Bcast(place, 2, MPI_INT, 0, node.comm), "MPI_Bcast");
  layout.node_rank = place[0];
  layout.nnodes = place[1];
  return layout;
}

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
