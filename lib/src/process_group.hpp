#pragma once
// A set of ranks and the backend that connects them. This is where every collective is
// checked (once, at the entry), short-circuited when there is nothing to communicate (a
// world of one, empty buffers: Gloo's allgather dies of SIGFPE on an empty output), and
// where backend failures become idist::Error / idist::TimeoutError carrying rank, op and
// backend. Typed conveniences (strings, counts) are composed here from the byte-level
// backend calls, so every backend gets them for free.

#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.hpp"
#include "idist/errors.hpp"
#include "idist/work.hpp"

namespace idist::detail {

class ProcessGroup {
 public:
  // `site` gives the rank and world size that error messages show (global, not group-local).
  ProcessGroup(int rank, int size, std::unique_ptr<Backend> backend, ErrorSite site);
  // Waits (each bounded by the backend's timeout) for operations still in flight, so that no
  // completion outlives the connections it runs on.
  ~ProcessGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string_view backend_name() const { return backend_->name(); }

  void all_reduce(void* data, std::size_t count, DType dtype, ReduceOp op);
  // Every rank's element count, in rank order.
  std::vector<std::size_t> all_gather_counts(std::size_t count);
  // `counts` as returned by all_gather_counts(count); out holds their sum of elements.
  void all_gather_v(const void* in, std::size_t count, const std::vector<std::size_t>& counts, void* out,
                    std::size_t element_size);
  std::vector<std::string> all_gather(const std::string& value);
  void broadcast(void* data, std::size_t bytes, int src, const char* op_name = "broadcast");
  std::string broadcast(const std::string& value, int src);
  void barrier();

  // Point-to-point between this group's ranks; `tag` >= 0 tells transfers apart.
  void send(const void* data, std::size_t bytes, int dst, int tag);
  void recv(void* data, std::size_t bytes, int src, int tag);
  Work isend(const void* data, std::size_t bytes, int dst, int tag);
  Work irecv(void* data, std::size_t bytes, int src, int tag);

  // An Error for `op` with this group's rank, world size and backend.
  ErrorSite site(std::string_view op) const;

 private:
  // Why the group is unusable (empty while healthy). Shared with completions that finish on
  // other threads, hence the lock.
  struct Health {
    std::mutex mu;
    std::string broken;
  };

  // Runs a backend call, turning its failures into idist errors. After a failure the
  // backend's connections are in an unknown state, so the group refuses further calls.
  template <class F>
  static void run(Health& health, const ErrorSite& site, F&& f);
  template <class F>
  void run(std::string_view op, F&& f) {
    run(*health_, site(op), std::forward<F>(f));
  }
  void check_src(std::string_view op, int src) const;
  void check_peer(std::string_view op, std::string_view role, int peer, int tag, const void* data,
                  std::size_t bytes) const;
  // Completes `completion` on its own thread; the Work rethrows its failure where it is waited for.
  Work start(std::string_view op, Backend::Completion completion);

  int rank_;
  int size_;
  std::unique_ptr<Backend> backend_;
  ErrorSite site_;
  std::shared_ptr<Health> health_ = std::make_shared<Health>();
  std::vector<std::shared_future<void>> in_flight_;
};

}  // namespace idist::detail
