#include "generation_watch.hpp"

#include <unistd.h>

#include <chrono>

#include "idist/env_contract.hpp"

namespace idist::detail {

namespace {

// One wait's bound: the watch waits again after it, for as long as the rank runs.
constexpr auto kWaitBound = std::chrono::hours(1);
// While the rank re-forms (the generation it was told of is not its own yet).
constexpr auto kReformPoll = std::chrono::milliseconds(20);

}  // namespace

GenerationWatch::GenerationWatch(const TcpStoreOptions& store, std::function<std::uint64_t()> current,
                                 std::function<void(std::uint64_t)> superseded)
    : store_(std::make_unique<TcpStore>(store)),
      current_(std::move(current)),
      superseded_(std::move(superseded)),
      owner_(::getpid()) {
  thread_ = std::make_unique<std::thread>([this] { run(); });
}

GenerationWatch::~GenerationWatch() {
  if (::getpid() != owner_) {
    (void)thread_.release();  // a forked child has the object, not the thread
    return;
  }
  stop_ = true;
  store_->interrupt();
  thread_->join();
}

void GenerationWatch::run() {
  while (!stop_) {
    const auto g = current_();
    try {
      store_->wait({env::generation_key(g + 1)}, kWaitBound);
    } catch (const TimeoutFailure&) {
      continue;  // the bound passed: wait again
    } catch (const std::exception&) {
      return;  // interrupted, or idist-run is gone: nothing more to watch
    }
    if (stop_) return;
    if (current_() == g) superseded_(g);
    while (!stop_ && current_() == g) std::this_thread::sleep_for(kReformPoll);
  }
}

}  // namespace idist::detail
