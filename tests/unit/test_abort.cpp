// Backend::abort, live recovery's first step: one rank's abort ends every wait on it, on every
// backend that can recover (gloo, shm, hierarchical), as a PeerLostError and never a timeout.
// Rank 3 stands for a lost peer: it never makes the call, and its group is aborted (its
// connections close, its abort shows in shared memory) while the others wait for it. Each
// survivor then aborts its own group, as the runtime will in recovery mode, so that a survivor
// waiting on another survivor is freed too.

#include <doctest/doctest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "configurations.hpp"
#include "idist/errors.hpp"
#include "ranks.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using idist::detail::ProcessGroup;

constexpr int kRanks = 4;
constexpr int kLost = 3;

// Counts the ranks done, so that the lost rank's group outlives the survivors' waits.
class Done {
 public:
  void one() {
    std::lock_guard lock(mu_);
    ++count_;
    changed_.notify_all();
  }
  void wait_for(int n) {
    std::unique_lock lock(mu_);
    changed_.wait(lock, [&] { return count_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int count_ = 0;
};

bool can_abort(const test::Config& config) { return !config.needs_ucx(); }

// `call` is what the survivors wait in; `abort_self`: rank 0's group is aborted from another
// thread while rank 0 waits in it, before the lost rank's.
void survivors_end_at_once(const test::Config& config, const std::function<void(ProcessGroup&)>& call,
                           bool abort_self = false) {
  Done done;
  std::atomic<int> raised{0};
  std::array<std::atomic<ProcessGroup*>, kRanks> groups{};
  test::run_ranks(config, kRanks, [&](ProcessGroup& group, test::Failures& failures) {
    const int r = group.rank();
    groups[static_cast<std::size_t>(r)].store(&group);
    if (r == kLost) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (abort_self) {
        while (groups[0].load() == nullptr) std::this_thread::yield();
        groups[0].load()->abort("the test aborts rank 0 from another thread");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      group.abort("rank 3 stands for a lost peer");
      done.wait_for(kRanks - 1);
      return;
    }
    const auto start = Clock::now();
    std::string caught = "nothing";
    try {
      call(group);
    } catch (const idist::PeerLostError& e) {
      caught = "PeerLostError";
      ++raised;
      if (r == 0 && abort_self && std::string(e.what()).find("this rank aborted the group") == std::string::npos)
        failures.add(r, std::string("not named as its own abort: ") + e.what());
    } catch (const idist::TimeoutError& e) {
      caught = std::string("TimeoutError: ") + e.what();
    } catch (const idist::Error& e) {
      // Rank 0 aborted from another thread before its call began (a loaded machine): the call
      // is refused as on an aborted group, which is as right.
      const bool refused = std::string(e.what()).find("unusable after an earlier failure: aborted") != std::string::npos;
      caught = r == 0 && abort_self && refused ? "PeerLostError" : std::string("another error: ") + e.what();
      if (caught == "PeerLostError") ++raised;
    } catch (const std::exception& e) {
      caught = std::string("another error: ") + e.what();
    }
    group.abort("a peer was lost");  // the cascade: whoever waits on this rank is freed
    const auto took = std::chrono::duration<double>(Clock::now() - start).count();
    if (caught != "PeerLostError") failures.add(r, "raised " + caught);
    // 50 ms until the abort; seconds only on a machine too loaded to schedule the threads.
    if (took > 5.0) failures.add(r, "took " + std::to_string(took) + " s");
    try {
      group.barrier();
      failures.add(r, "a call after the abort went through");
    } catch (const idist::Error& e) {
      if (std::string(e.what()).find("unusable after an earlier failure") == std::string::npos)
        failures.add(r, std::string("a call after the abort: ") + e.what());
    }
    done.one();
  }, std::chrono::seconds(20));
  CHECK(raised.load() == kRanks - 1);
}

}  // namespace

TEST_CASE("an aborted peer ends the survivors' all_reduce with PeerLostError") {
  test::for_each_backend_where(can_abort, [](const test::Config& config) {
    for (int round = 0; round < 2; ++round)
      survivors_end_at_once(config, [](ProcessGroup& g) {
        float x = 1;
        g.all_reduce(&x, 1, idist::DType::float32, idist::ReduceOp::SUM);
      });
  });
}

TEST_CASE("an aborted peer ends a broadcast from it, a recv from it and an async all_reduce") {
  test::for_each_backend_where(can_abort, [](const test::Config& config) {
    survivors_end_at_once(config, [](ProcessGroup& g) {
      std::array<char, 64> data{};
      g.broadcast(data.data(), data.size(), idist::DType::uint8, kLost);
    });
    survivors_end_at_once(config, [](ProcessGroup& g) {
      std::array<char, 64> data{};
      g.recv(data.data(), data.size(), kLost, 0);
    });
    survivors_end_at_once(config, [](ProcessGroup& g) {
      std::array<float, 1024> data{};
      auto work = g.iall_reduce(data.data(), data.size(), idist::DType::float32, idist::ReduceOp::SUM);
      work.wait();
    });
  });
}

TEST_CASE("a rank's own group aborted from another thread ends its call, named as its own abort") {
  test::for_each_backend_where(can_abort, [](const test::Config& config) {
    survivors_end_at_once(
        config,
        [](ProcessGroup& g) {
          float x = 1;
          g.all_reduce(&x, 1, idist::DType::float32, idist::ReduceOp::SUM);
        },
        true);
  });
}
