// A training-like loop for idist-run --metrics (metrics.sh, issue 47):
//   metrics_rank STEPS WORK_MS [SLOW_RANK SLOW_PCT]
// Each step marks itself (idist::mark_step()), computes for WORK_MS (a busy loop: a rank given
// less cpu takes longer), then all_reduces a 256 KiB gradient and an 8-byte loss, as a data-
// parallel step does. SLOW_RANK's work takes SLOW_PCT% longer. STEPS 0: until a file named
// `stop` appears in the working directory (rank 0 looks, and says so to every rank with the
// step's loss). Rank 0 prints the steps, the losses' sum (the world size a step) and the gradient.
#include <idist/idist.hpp>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: metrics_rank STEPS WORK_MS [SLOW_RANK SLOW_PCT]\n");
    return 2;
  }
  const int steps = std::stoi(argv[1]);
  const double work_ms = std::stod(argv[2]);
  const int slow_rank = argc > 4 ? std::stoi(argv[3]) : -1;
  const double slow_pct = argc > 4 ? std::stod(argv[4]) : 0;
  idist::init();
  const int rank = idist::get_rank();
  const auto work = std::chrono::duration<double, std::milli>(work_ms * (rank == slow_rank ? 1 + slow_pct / 100 : 1));
  std::vector<float> gradient(64 * 1024);
  double loss = 0;
  int done = 0;
  for (int step = 0; steps == 0 || step < steps; ++step) {
    idist::mark_step();
    const auto end = std::chrono::steady_clock::now() + work;
    volatile double sink = 0;
    while (std::chrono::steady_clock::now() < end) sink = sink + 1.0;
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
