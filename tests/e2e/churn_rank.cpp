// A rank of e2e.churn: tiny gloo all_reduces in a loop, for the test to kill -9 one rank in the
// middle of them. Once the first all_reduce is through it prints "rank R pid P ready" (the test
// reads the victim's pid there). The sums are checked in closed form; without a kill it stops
// after 30 s and exits 0.
#include <idist/idist.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

int main() try {
  idist::init();
  const std::int64_t r = idist::get_rank();
  const std::int64_t n = idist::get_world_size();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (std::int64_t i = 0; std::chrono::steady_clock::now() < until; ++i) {
    const std::int64_t sum = idist::all_reduce(r + i);
    if (sum != n * (n - 1) / 2 + n * i) {
      std::fprintf(stderr, "rank %lld: all_reduce %lld: got %lld\n", static_cast<long long>(r),
                   static_cast<long long>(i), static_cast<long long>(sum));
      return 1;
    }
    if (i == 0) {
      std::printf("rank %lld pid %d ready\n", static_cast<long long>(r), static_cast<int>(::getpid()));
      std::fflush(stdout);
    }
  }
  idist::finalize();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
