#pragma once
// The handle of an operation that goes on while the caller does other things (isend, irecv),
// as c10d's Work. Its buffer must stay untouched until wait() returns.

#include <chrono>
#include <memory>

#include "idist/export.hpp"

namespace idist {
namespace detail {
struct WorkState;
}

class IDIST_API Work {
 public:
  Work() = default;  // an operation that is already complete
  explicit Work(std::shared_ptr<detail::WorkState> state);

  // Blocks until the operation is done, and rethrows its error (idist::Error,
  // idist::TimeoutError) here, on the caller's thread. With a timeout, throws
  // idist::TimeoutError when it is not done by then; it goes on, and may be waited for again.
  void wait();
  void wait(std::chrono::milliseconds timeout);
  // Done, successfully or not (wait() then returns at once).
  [[nodiscard]] bool is_completed() const;

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace idist
