#include "generation_watch.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <vector>

#include "idist/env_contract.hpp"

namespace idist::detail {

namespace {

// One wait's bound: the watch waits again after it, for as long as the rank runs.
constexpr auto kWaitBound = std::chrono::hours(1);
// While the rank re-forms (the generation it was told of is not its own yet).
constexpr auto kReformPoll = std::chrono::milliseconds(20);

}  // namespace

GenerationWatch::GenerationWatch(const TcpStoreOptions& store, Calls calls)
    : store_(std::make_unique<TcpStore>(store)), calls_(std::move(calls)), owner_(::getpid()) {
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
  auto seen = calls_.current();  // the newest generation this watch knows of
  while (!stop_) {
    const auto next = seen + 1;
    std::vector<char> word;
    try {
      store_->wait({env::generation_key(next)}, kWaitBound);
      word = store_->get(env::generation_key(next));
    } catch (const TimeoutFailure&) {
      continue;  // the bound passed: wait again
    } catch (const std::exception&) {
      return;  // interrupted, or idist-run is gone: nothing more to watch
    }
    if (stop_) return;
    const std::string_view text(word.data(), word.size());
    if (text.ends_with(env::kGrowTag)) {
      calls_.replacement(next);
      seen = next;
      continue;
    }
    const auto g = calls_.current();
    if (g < next) calls_.superseded(g);
    while (!stop_ && calls_.current() < next) std::this_thread::sleep_for(kReformPoll);
    seen = std::max(next, calls_.current());
  }
}

}  // namespace idist::detail
