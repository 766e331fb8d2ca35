#pragma once
// The one way idist waits on something that cannot wake it (MPI_Test, NCCL's and CUDA's
// queries, a key in the store): test at once for a moment (a short operation completes within
// microseconds), then yield between tests for a while (another rank may need this core), then
// nap, so that a long wait (a peer still computing) costs no CPU. Each caller says how long
// each phase lasts. shm waits on futex words instead (backends/shm/sync.hpp): those can wake
// their sleepers.

#include <chrono>
#include <thread>

#include "common/cpus_shared.hpp"

namespace idist::detail {

struct BackoffPolicy {
  std::chrono::microseconds spin{20};     // test again at once
  std::chrono::microseconds yield{2000};  // then yield the processor between tests
  std::chrono::microseconds nap{100};     // then sleep this long between tests
};

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  // Where the cpus are shared (common/cpus_shared.hpp), yielding from the first test.
  explicit Backoff(BackoffPolicy policy = {}) : policy_(policy) {
    if (cpus_shared()) {
      policy_.yield += policy_.spin;
      policy_.spin = {};
    }
  }

  // Between two tests.
  void pause() const { pause(Clock::now()); }
  // The same, with the time the caller has just read (a clock read costs as much as a test).
  void pause(Clock::time_point now) const {
    const auto waited = now - start_;
    if (waited < policy_.spin) return;
    if (waited < policy_.spin + policy_.yield) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(policy_.nap);
    }
  }

 private:
  BackoffPolicy policy_;
  Clock::time_point start_ = Clock::now();
};

// Calls done() until it returns true (then true) or `deadline` passes (then false).
// One clock read per test: on a VM under load it cost more than the MPI_Testall it paced.
template <class Done>
bool poll_until(Done&& done, Backoff::Clock::time_point deadline, BackoffPolicy policy = {}) {
  if (done()) return true;
  for (const Backoff backoff(policy);;) {
    const auto now = Backoff::Clock::now();
    if (now >= deadline) return false;
    backoff.pause(now);
    if (done()) return true;
  }
}

}  // namespace idist::detail
