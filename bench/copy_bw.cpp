// copy_bw: the memory-bandwidth ceiling of this machine, for scripts/bench.sh's report. A
// shared-memory collective moves its data with memcpy-like loops, so the rate at which one and
// two threads can copy a buffer far larger than the caches bounds what the shm backend's busbw
// can reach here; without it a busbw figure has nothing to be read against.
//
//   copy_bw [-s 64M] [-t 1.0]
//   {"bytes": 67108864, "threads": [{"threads": 1, "gb_s": 9.8}, {"threads": 2, "gb_s": 13.1}]}
//
// GB/s counts the bytes copied (1e9 per second), as busbw counts bytes moved; the memory
// traffic is twice that (each byte read once and written once).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// THREADS threads copy their own BYTES-buffer into their own destination for SECONDS; the
// bytes copied by all of them, per second of the slowest one.
double copy_rate(int threads, std::size_t bytes, double seconds) {
  std::vector<std::vector<char>> src(threads), dst(threads);
  std::vector<std::size_t> copies(threads, 0);
  std::vector<double> elapsed(threads, 0);
  std::barrier start(threads);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      // Each thread touches its own pages first, so that they are mapped (and placed) before
      // the clock starts: page faults would otherwise be most of the first copies.
      src[t].assign(bytes, static_cast<char>(t + 1));
      dst[t].assign(bytes, 0);
      std::memcpy(dst[t].data(), src[t].data(), bytes);
      start.arrive_and_wait();
      const auto begin = Clock::now();
      const auto until = begin + std::chrono::duration<double>(seconds);
      std::size_t n = 0;
      do {
        std::memcpy(dst[t].data(), src[t].data(), bytes);
        ++n;
      } while (Clock::now() < until);
      copies[t] = n;
      elapsed[t] = std::chrono::duration<double>(Clock::now() - begin).count();
    });
  }
  for (auto& w : workers) w.join();
  double total = 0;
  for (int t = 0; t < threads; ++t) total += static_cast<double>(copies[t]) * static_cast<double>(bytes);
  return total / *std::max_element(elapsed.begin(), elapsed.end()) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"copy_bw: memcpy bandwidth with 1 and 2 threads, as JSON"};
  std::size_t bytes = 64 << 20;
  double seconds = 1.0;
  int max_threads = 2;
  app.add_option("-s,--size", bytes, "Bytes per buffer (each thread has its own)")
      ->transform(CLI::AsSizeValue(false))->capture_default_str();
  app.add_option("-t,--time", seconds, "Seconds per thread count")->check(CLI::Range(0.01, 600.0))->capture_default_str();
  app.add_option("-j,--threads", max_threads, "Up to this many threads")->check(CLI::Range(1, 64))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  nlohmann::json rates = nlohmann::json::array();
  for (int threads = 1; threads <= max_threads; ++threads)
    rates.push_back({{"threads", threads}, {"gb_s", copy_rate(threads, bytes, seconds)}});
  std::cout << nlohmann::json{{"bytes", bytes}, {"threads", rates}}.dump() << "\n";
  return 0;
}
