// The rendezvous store under load: 1,000 clients at once, as a 1,000-rank job's bootstrap
// would be, each a thread with its own connection. Prints the figures it measured.
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "store/tcp_store.hpp"
#include "store/tcp_store_server.hpp"

using namespace idist::detail;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Two descriptors per client (ours and the server's end) in one process.
void raise_fd_limit(rlim_t wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = std::min(limit.rlim_max, wanted);
  ::setrlimit(RLIMIT_NOFILE, &limit);
}

struct Percentiles {
  double p50_us, p99_us, max_us;
};

Percentiles percentiles(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<std::size_t>(q * static_cast<double>(us.size())))]; };
  return {at(0.50), at(0.99), us.back()};
}

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

}  // namespace

TEST_CASE("1,000 concurrent clients each set, wait and get, and all complete") {
  constexpr int kClients = 1000;
  raise_fd_limit(4 * kClients + 256);
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  REQUIRE_MESSAGE(limit.rlim_cur >= 2 * kClients + 64, "RLIMIT_NOFILE " << limit.rlim_cur << " is too low for the test");

  TcpStoreServer server({"127.0.0.1", 0, "load-token"});
  std::vector<double> connect_us(kClients), set_us(kClients), wait_us(kClients), get_us(kClients);
  std::atomic<int> completed{0};
  std::mutex errors_mu;
  std::vector<std::string> errors;
  // Every client connects first, then all start together: the requests are truly concurrent.
  std::barrier start_line(kClients + 1);
  Clock::time_point start;

  std::vector<std::thread> threads;
  threads.reserve(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      const auto me = static_cast<std::size_t>(i);
      std::unique_ptr<TcpStore> store;
      try {
        const auto t0 = Clock::now();
        store = std::make_unique<TcpStore>(TcpStoreOptions{"127.0.0.1", server.port(), "load-token", 60s});
        connect_us[me] = micros(Clock::now() - t0);
      } catch (const std::exception& e) {
        std::lock_guard lock(errors_mu);
        errors.push_back("client " + std::to_string(i) + " connect: " + e.what());
      }
      start_line.arrive_and_wait();
      if (!store) return;
      try {
        const auto mine = "load/" + std::to_string(i);
        const auto next = "load/" + std::to_string((i + 1) % kClients);
        auto t = Clock::now();
        store->set(mine, std::vector<char>(mine.begin(), mine.end()));
        set_us[me] = micros(Clock::now() - t);
        t = Clock::now();
        store->wait({next}, 60s);
        wait_us[me] = micros(Clock::now() - t);
        t = Clock::now();
        const auto value = store->get(next);
        get_us[me] = micros(Clock::now() - t);
        if (std::string(value.begin(), value.end()) != next) throw std::runtime_error("got the wrong value");
        ++completed;
      } catch (const std::exception& e) {
        std::lock_guard lock(errors_mu);
        errors.push_back("client " + std::to_string(i) + ": " + e.what());
      }
    });
  }
  start_line.arrive_and_wait();
  start = Clock::now();
  for (auto& t : threads) t.join();
  const auto elapsed = Clock::now() - start;

  for (const auto& e : errors) MESSAGE(e);
  CHECK(completed == kClients);
  const double seconds = std::chrono::duration<double>(elapsed).count();
  CHECK(seconds < 30);

  const auto c = percentiles(connect_us), s = percentiles(set_us), w = percentiles(wait_us), g = percentiles(get_us);
  char figures[1024];
  std::snprintf(figures, sizeof(figures),
                "store load: %d clients, set+wait+get each: %.3f s after all connected, %.0f requests/s\n"
                "  latency (us)   p50       p99       max\n"
                "  connect+hello %9.0f %9.0f %9.0f\n"
                "  set           %9.0f %9.0f %9.0f\n"
                "  wait          %9.0f %9.0f %9.0f\n"
                "  get           %9.0f %9.0f %9.0f",
                kClients, seconds, 3 * kClients / seconds, c.p50_us, c.p99_us, c.max_us, s.p50_us, s.p99_us, s.max_us,
                w.p50_us, w.p99_us, w.max_us, g.p50_us, g.p99_us, g.max_us);
  MESSAGE(figures);
}
