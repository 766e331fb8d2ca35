// A training-like loop for idist-run --metrics (metrics.sh, issue 47):
//   metrics_rank STEPS WORK_MS [SLOW_RANK SLOW_PCT [SLOW_FROM]]
// Each step marks itself (idist::mark_step()), computes for WORK_MS (a busy loop: a rank given
// less cpu takes longer), then all_reduces a 256 KiB gradient and an 8-byte loss, as a data-
// parallel step does. SLOW_RANK's work takes SLOW_PCT% longer from step SLOW_FROM (0: all). STEPS 0: until a file named
// `stop` appears in the working directory (rank 0 looks, and says so to every rank with the
// step's loss). Rank 0 prints the steps, the losses' sum (the world size a step) and the gradient.
// The work spins for WORK_MS of wall-clock time, the same whoever shares the cpu; with
// METRICS_RANK_COMPUTE=1 it is a fixed amount of arithmetic instead (rank 0 times WORK_MS of it
// at the start), which a shared cpu makes slower. METRICS_RANK_SLEEP_MS: a sleep after it (the
// slow rank's longer too). METRICS_RANK_PROGRESS: rank 0 prints "step N" after each.
#include <idist/idist.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

double crunch(std::uint64_t n) {
  volatile double sink = 0;
  for (std::uint64_t i = 0; i < n; ++i) sink = sink * 0.5 + 1.0;
  return sink;
}

// Rank 0's count of crunch() iterations that take `ms` here, for every rank.
std::uint64_t iterations_for(double ms) {
  std::uint64_t n = 0;
  if (idist::get_rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    n = 100000;
    crunch(n);
    const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    n = static_cast<std::uint64_t>(static_cast<double>(n) * ms / took);
  }
  return static_cast<std::uint64_t>(idist::broadcast(static_cast<std::int64_t>(n), 0));
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: metrics_rank STEPS WORK_MS [SLOW_RANK SLOW_PCT [SLOW_FROM]]\n");
    return 2;
  }
  const int steps = std::stoi(argv[1]);
  const double work_ms = std::stod(argv[2]);
  const int slow_rank = argc > 4 ? std::stoi(argv[3]) : -1;
  const double slow_pct = argc > 4 ? std::stod(argv[4]) : 0;
  const int slow_from = argc > 5 ? std::stoi(argv[5]) : 0;
  idist::init();
  const int rank = idist::get_rank();
  const double factor = rank == slow_rank ? 1 + slow_pct / 100 : 1;
  const auto work = std::chrono::duration<double, std::milli>(work_ms * factor);
  const auto usual = std::chrono::duration<double, std::milli>(work_ms);
  const char* compute_env = std::getenv("METRICS_RANK_COMPUTE");
  const bool compute = compute_env != nullptr && std::string(compute_env) == "1";
  const std::uint64_t base_iterations = compute ? iterations_for(work_ms) : 0;
  const auto iterations = static_cast<std::uint64_t>(static_cast<double>(base_iterations) * factor);
  const char* sleep_env = std::getenv("METRICS_RANK_SLEEP_MS");
  const double sleep_ms = sleep_env ? std::stod(sleep_env) : 0;
  const auto pause = std::chrono::duration<double, std::milli>(sleep_ms * factor);
  const auto usual_pause = std::chrono::duration<double, std::milli>(sleep_ms);
  const bool progress = std::getenv("METRICS_RANK_PROGRESS") != nullptr && rank == 0;
  std::vector<float> gradient(64 * 1024);
  double loss = 0;
  int done = 0;
  for (int step = 0; steps == 0 || step < steps; ++step) {
    idist::mark_step();
    const bool slow = step >= slow_from;
    if (compute) {
      crunch(slow ? iterations : base_iterations);
    } else {
      const auto end = std::chrono::steady_clock::now() + (slow ? work : usual);
      volatile double sink = 0;
      while (std::chrono::steady_clock::now() < end) sink = sink + 1.0;
    }
    if (sleep_ms > 0) std::this_thread::sleep_for(slow ? pause : usual_pause);
    if (progress) {
      std::printf("step %d\n", step + 1);
      std::fflush(stdout);
    }
    for (auto& g : gradient) g = 1.0f;
    idist::all_reduce(gradient);
    // The loss's all_reduce carries rank 0's word to stop (a count of 1000 or more).
    const bool stop = steps == 0 && rank == 0 && std::filesystem::exists("stop");
    const double got = idist::all_reduce(stop ? 1001.0 : 1.0);
    loss += got >= 1000 ? got - 1000 : got;
    ++done;
    if (got >= 1000) break;
  }
  if (rank == 0) std::printf("metrics_rank: done steps=%d loss=%g gradient=%g\n", done, loss, gradient[0]);
  idist::finalize();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "metrics_rank: %s\n", e.what());
  return 1;
}
