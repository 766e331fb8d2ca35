#pragma once
// A set of ranks and the backend that connects them. This is where every collective is
// checked (once, at the entry), short-circuited when there is nothing to communicate (a
// group of one, empty buffers: Gloo's allgather dies of SIGFPE on an empty output), checked
// across ranks under IDIST_DEBUG, and where backend failures become idist::Error /
// idist::TimeoutError carrying rank, op and backend. Typed conveniences (strings, counts,
// metadata-first broadcast) are composed here from the byte-level backend calls, so every
// backend gets them for free.
//
// Ranks here are the group's own (0..size-1); translating the public API's global ranks is
// the caller's business (api.cpp).
//
// Async collectives run one at a time, in call order, on worker threads chained one after
// the other; a blocking collective first waits for the async ones before it. So collectives
// reach the backend in the same order on every rank, whichever mix of calls a program makes.

#include <atomic>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "idist/errors.hpp"
#include "idist/work.hpp"
#include "recorder.hpp"

namespace idist::detail {

struct ProcessGroupOptions {
  int rank = 0;
  int size = 1;
  // The rank and world size that error messages show (global, not group-local), and the
  // group's description ("world", "group [0, 2]").
  ErrorSite site;
  std::string description = "world";
  // IDIST_DEBUG: check before each collective that every rank calls the same one.
  bool debug = false;
  // After a collective timed out: which ranks did not arrive at it ("ranks 2, 3 did not
  // arrive"), found out-of-band by the runtime (the store), or empty when it cannot tell.
  // Gets the op and the collective's number in this group (the same on every rank).
  // `call`: the call as this rank made it ("all_reduce(float32, count 2, SUM)"), to compare
  // with the calls the others were in.
  std::function<std::string(std::string_view op, std::string_view call, std::uint64_t number)> explain_timeout = {};
  // After a peer was lost in a collective (PeerLostFailure; member -1: unknown): what the
  // members that left said as they did (finalize's note in the store), or empty when none
  // left that way (a crash, a kill) or the runtime cannot tell.
  std::function<std::string(int member, std::string_view op, std::uint64_t number)> explain_departure = {};
  // Live recovery: called on the thread that found a peer lost (not for this rank's own
  // abort), before the error is raised, so that the runtime aborts every group of the
  // generation and no survivor is left waiting on this rank (the cascade, runtime_reform.cpp).
  std::function<void()> on_peer_lost = {};
  // The world rank of each group rank (empty: the group is the world).
  std::vector<int> members = {};
  // In the flight recorder: -1 the world, else new_group's number (last: set by name).
  std::int32_t group_id = -1;
  std::uint32_t epoch = 0;  // the runtime's number: collectives are numbered afresh by each init()
};

class ProcessGroup {
 public:
  ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options);
  // Waits (each bounded by the backend's timeout) for operations still in flight, so that no
  // completion outlives the connections it runs on.
  ~ProcessGroup();

  int rank() const { return options_.rank; }
  int size() const { return options_.size; }
  // The backend the program chose ("gloo"); backend().name() is the one doing the work ("shm").
  std::string_view backend_name() const { return options_.site.backend; }
  // The collectives called so far (numbered from 0 in call order, alike on every rank).
  std::uint64_t calls() const { return collectives_.load(std::memory_order_relaxed); }
  Backend& backend() { return *backend_; }

  // Reductions (in place unless stated). `root` is a group rank.
  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op);
  Work iall_reduce(void* data, std::size_t count, DType dtype, ReduceOp op);
  void reduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
  Work ireduce(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
  // `in` holds size * count elements, `out` count.
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);

  // Every rank's element count, in rank order.
  // `dtype` is the elements' type: ranks must agree on it (checked under IDIST_DEBUG).
  std::vector<std::size_t> all_gather_counts(std::size_t count, DType dtype = DType::uint8);
  // `counts` as returned by all_gather_counts(count); out holds their sum of elements.
  void all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                    std::size_t element_size);
  // Equal counts: out holds size * count elements.
  void all_gather(const void* in, std::size_t count, DType dtype, void* out);
  Work iall_gather(const void* in, std::size_t count, DType dtype, void* out);
  std::vector<std::string> all_gather(const std::string& value);
  // Equal counts; out (size * count elements) is written on root only.
  void gather(const void* in, std::size_t count, DType dtype, void* out, int root);
  // root's `in` holds size * count elements (in_count, checked there); every rank receives
  // its block in out.
  void scatter(const void* in, std::size_t in_count, void* out, std::size_t count, DType dtype, int root);

  // Every rank passes src's count. With `checked`, the count and dtype travel first and a
  // rank whose buffer differs makes every rank raise, instead of a silent corruption.
  void broadcast(void* data, std::size_t count, DType dtype, int src, bool checked = false);
  Work ibroadcast(void* data, std::size_t count, DType dtype, int src);
  // Metadata first: ranks other than src need not know the length or even the dtype.
  std::string broadcast(const std::string& value, int src);
  Tensor broadcast(const std::optional<Tensor>& value, int src);

  void barrier();
  Work ibarrier();

  // Point-to-point between this group's ranks; `tag` >= 0 tells transfers apart.
  void send(const void* data, std::size_t bytes, int dst, int tag);
  void recv(void* data, std::size_t bytes, int src, int tag);
  Work isend(const void* data, std::size_t bytes, int dst, int tag);
  Work irecv(void* data, std::size_t bytes, int src, int tag);

  // A sub-group of this one's ranks `members` (group ranks, in the new group's order). Called
  // by members only, in the same order on each.
  std::unique_ptr<ProcessGroup> make_group(const std::vector<int>& members, BackendInit init,
                                           ProcessGroupOptions options);

  // Ends this rank's part in the group, from any thread, with calls in flight or not
  // (Backend::abort): they raise PeerLostError, the peers' waits on this rank end too, and
  // every later call raises "unusable after an earlier failure: aborted: <why>".
  void abort(const std::string& why);

  // An error site for `op` with this group's rank, world size and backend.
  ErrorSite site(std::string_view op) const;

 private:
  // Why the group is unusable (empty while healthy). Shared with completions that finish on
  // other threads, hence the lock.
  struct Health {
    std::mutex mu;
    std::string broken;
    std::atomic<bool> failed{false};  // broken is set: read without the lock on every call
  };

  // What every rank must agree on for a collective; compared across ranks under IDIST_DEBUG.
  using Op = common::recorder::Op;
  struct Signature {
    Op op = Op::none;
    DType dtype = DType::uint8;
    std::uint64_t count = 0;  // kAnyCount where ranks may differ (all_gather)
    ReduceOp reduce = ReduceOp::SUM;
    std::int32_t root = -1;
    std::string_view name() const { return common::recorder::op_name(op); }
  };
  static constexpr std::uint64_t kAnyCount = ~std::uint64_t{0};

  // A call's body: a void() callable kept inline. What a body captures is a few pointers and
  // sizes, and std::function allocates beyond 16 bytes of them: a malloc and a free on every
  // call, 0.01 of a world of one's 0.06 us per all_reduce (docs/BENCHMARKS.md).
  class Body {
   public:
    Body() = default;
    template <class F>
      requires(!std::is_same_v<std::decay_t<F>, Body>)
    Body(F f) : invoke_([](const void* at) { (*static_cast<const F*>(at))(); }) {
      static_assert(sizeof(F) <= kBytes && alignof(F) <= alignof(std::max_align_t),
                    "a body captures a few pointers and sizes");
      static_assert(std::is_trivially_copyable_v<F> && std::is_trivially_destructible_v<F>,
                    "a body is copied as bytes: it captures pointers and sizes, not owners");
      new (storage_) F(f);
    }
    explicit operator bool() const { return invoke_ != nullptr; }
    void operator()() const { invoke_(storage_); }

   private:
    static constexpr std::size_t kBytes = 64;
    alignas(std::max_align_t) unsigned char storage_[kBytes];
    void (*invoke_)(const void*) = nullptr;
  };

  // A checked collective, ready to run: `body` talks to the backend and is empty when there
  // is nothing to do. Built on the caller's thread, run there or on a worker.
  struct Call {
    Signature signature;
    Body body;
    std::uint64_t bytes = kAnyCount;  // for the metrics, where the signature's count does not say
  };

  // Runs a backend call, turning its failures into idist errors (idist/errors.hpp). After a
  // failure other than an InStepError the backend's connections are in an unknown state, so
  // the group refuses further calls.
  // `where()` makes the error site, only when there is an error to report: on the path every
  // call takes, building one (strings) cost more than a shared-memory all_reduce of 8 bytes.
  // `members`: the world rank of each group rank (empty: the world), to name a lost peer.
  template <class Where, class F>
  static void run(Health& health, const std::vector<int>& members, Where&& where, F&& f);
  template <class F>
  void run(std::string_view op, F&& f) {
    try {
      run(*health_, options_.members, [&] { return site(op); }, std::forward<F>(f));
    } catch (const PeerLostError&) {
      // Sends and receives too (collectives did it in run_body, before the departure lookup);
      // a second call is a no-op.
      if (options_.on_peer_lost) options_.on_peer_lost();
      throw;
    }
  }
  bool alone() const { return options_.size == 1 && backend_->traits().skip_group_of_one; }
  void execute(const Call& call);   // blocking: after the async ones, on this thread
  Work enqueue(Call call);          // async: after the async ones, on a worker
  void check_signatures(const Signature& mine, const std::string& invalid = {});
  // Runs the argument checks of a collective. Under IDIST_DEBUG a rank whose own arguments are
  // wrong still joins the signature exchange, flagged, so the others raise too instead of
  // waiting for it (or pairing with its next collective).
  template <class Checks>
  void validate(const Signature& signature, Checks&& checks);
  void check_root(std::string_view op, std::string_view role, int root) const;
  void check_buffer(std::string_view op, const void* data, std::size_t count) const;
  void check_reduce(std::string_view op, DType dtype, ReduceOp reduce) const;
  void check_peer(std::string_view op, std::string_view role, int peer, int tag, const void* data,
                  std::size_t bytes) const;
  Call all_reduce_call(void* data, std::size_t count, DType dtype, ReduceOp op);
  // What the backend is asked for in place of `op`, and the division AVG needs after it.
  ReduceOp backend_op(ReduceOp op) const;
  void average(ReduceOp op, void* data, std::size_t count, DType dtype) const;
  Call reduce_call(void* data, std::size_t count, DType dtype, ReduceOp op, int root);
  Call broadcast_call(void* data, std::size_t count, DType dtype, int src);
  Call all_gather_call(const void* in, std::size_t count, DType dtype, void* out);
  // Completes `completion` on its own thread; the Work rethrows its failure where it is waited for.
  class P2pRecord;
  class CallRecord;  // a collective's, in run_body
  Work start(std::string_view op, Backend::Completion completion, P2pRecord record);
  Work track(std::shared_future<void> done, ErrorSite site);

  // Runs a call's body, adding to a timeout who did not arrive.
  void run_body(const Call& call);

  std::unique_ptr<Backend> backend_;
  ProcessGroupOptions options_;
  bool defers_entry_ = false;  // the backend runs the recorder's entry in its wait (run_body)
  std::atomic<std::uint64_t> collectives_{0};  // numbered in call order, alike on every rank
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  std::shared_future<void> tail_;  // the last async collective
  std::vector<std::shared_future<void>> in_flight_;
  // This group's collectives in the flight recorder (they run one at a time, so a ring of
  // their own is written without atomic adds); its point-to-point calls go to the shared ring.
  // None for a group of one, which records nothing (and leaves the recorder unlooked-for in a
  // process that idist::spawn then forks).
  RecorderRing ring_ = alone() ? RecorderRing()
                                : RecorderRing::own(options_.epoch, options_.group_id,
                                                    stat_backend(options_.site.backend.empty() ? backend_->name()
                                                                                                : options_.site.backend));
  std::uint64_t history_ = 0;  // this group's calls so far, folded (Slot::history)
};

}  // namespace idist::detail
