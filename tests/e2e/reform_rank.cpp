// A training loop that survives lost ranks (live recovery, docs/RECOVERY.md), for reform.sh:
//   reform_rank STEPS STEP_MS
// Each step all_reduces a vector of (step + 1)s and checks the sum against the world's size;
// where a peer is lost (PeerLostError), the rank re-forms (idist::reform) and redoes the step.
// Survivors may be a step apart: a ring's all_reduce of step k can complete on some while it
// raises on another (the lost rank's last sends reached only some). So after a re-form they
// agree on the step (its max over the new world), and one behind takes step k's result, which
// every rank that completed it got, as idist::Recovery's reconcile takes a step from a rank
// ahead.
// With REFORM_RANK_SLOW=R, rank R (of generation 0) waits 500 ms after a loss before it
// re-forms: a slow survivor, which a test can kill while the others connect without it. With
// REFORM_RANK_LATE=R, rank R waits 3 s after its last step before finalize(): a test kills it
// while the others wait in theirs. With REFORM_RANK_SHORT=R, rank R runs half the steps and
// ends (exit 0): uneven steps, which no re-form mends; with REFORM_RANK_NO_FINALIZE too, it
// exits without finalize(), so that only idist-run can tell the others it ended. With
// REFORM_RANK_MONITORED set, every rank ends with a monitored_barrier before finalize().
// Every rank prints its pid first ("origin R pid P"), each re-form as it sees it, and rank 0
// of the last world one line at the end:
//   reform_rank: done steps=N redone=K reforms=G world=W sum=S
// Each redone step says how long after the loss it completed. S sums every step's all_reduced first element (the same on every rank, the same run
// after run for the same worlds). A wrong sum exits 3.
#include <idist/idist.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: reform_rank STEPS STEP_MS\n");
    return 2;
  }
  int steps = std::stoi(argv[1]);
  const auto pause = std::chrono::milliseconds(std::stoi(argv[2]));
  idist::init(idist::InitOptions{.recovery = true});
  const int origin = idist::get_rank();
  const int slow = std::getenv("REFORM_RANK_SLOW") ? std::atoi(std::getenv("REFORM_RANK_SLOW")) : -1;
  const int late = std::getenv("REFORM_RANK_LATE") ? std::atoi(std::getenv("REFORM_RANK_LATE")) : -1;
  const int short_rank = std::getenv("REFORM_RANK_SHORT") ? std::atoi(std::getenv("REFORM_RANK_SHORT")) : -1;
  if (short_rank == origin) steps /= 2;
  std::printf("origin %d pid %d\n", origin, static_cast<int>(::getpid()));
  std::fflush(stdout);
  std::vector<float> x(4096);
  int redone = 0, reforms = 0;
  double sum = 0;
  // From a loss seen to the redone step's end: what the loss cost this rank.
  std::chrono::steady_clock::time_point lost_at{};
  bool reconcile = false;
  int world_before = 0;  // of the world whose step may have completed on some ranks only
  for (int step = 0; step < steps;) {
    try {
      if (reconcile) {
        const int ahead = idist::all_reduce(step, idist::AllReduceOptions{.op = idist::ReduceOp::MAX});
        if (ahead > step) {
          sum += static_cast<double>(step + 1) * world_before;
          std::printf("origin %d: step %d taken from the ranks ahead\n", origin, step);
          ++step;
        }
        reconcile = false;
        if (step >= steps) break;
      }
      std::fill(x.begin(), x.end(), static_cast<float>(step + 1));
      idist::all_reduce(x);
    } catch (const idist::PeerLostError& e) {
      if (!idist::peer_lost()) {  // what auto_model stops a backward by
        std::fprintf(stderr, "origin %d: idist::peer_lost() is false after PeerLostError (%s)\n", origin, e.what());
        return 4;
      }
      if (!reconcile) world_before = idist::get_world_size();
      lost_at = std::chrono::steady_clock::now();
      if (slow == origin) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      const auto r = idist::reform();
      ++reforms;
      ++redone;
      std::string lost;
      for (int l : r.lost) lost += (lost.empty() ? "" : ",") + std::to_string(l);
      std::printf("origin %d pid %d: generation %llu: rank %d -> %d of %d, lost %s, redoing step %d\n", origin,
                  static_cast<int>(::getpid()), static_cast<unsigned long long>(r.generation), r.old_rank, r.rank,
                  r.world_size, lost.c_str(), step);
      std::fflush(stdout);
      reconcile = true;
      continue;
    }
    const float want = static_cast<float>((step + 1) * idist::get_world_size());
    for (float v : x)
      if (v != want) {
        std::fprintf(stderr, "origin %d: step %d: got %g, want %g\n", origin, step, static_cast<double>(v),
                     static_cast<double>(want));
        return 3;
      }
    sum += x[0];
    if (lost_at != std::chrono::steady_clock::time_point{}) {
      const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - lost_at).count();
      std::printf("origin %d: step %d redone %.1f ms after the loss was seen\n", origin, step, ms);
      std::fflush(stdout);
      lost_at = {};
    }
    ++step;
    idist::mark_step();
    std::this_thread::sleep_for(pause);
  }
  const int rank = idist::get_rank(), world = idist::get_world_size();
  if (late == origin) std::this_thread::sleep_for(std::chrono::seconds(3));
  if (short_rank == origin && std::getenv("REFORM_RANK_NO_FINALIZE") != nullptr) std::_Exit(0);
  // A monitored barrier collects in the store the re-formed world connects through.
  if (std::getenv("REFORM_RANK_MONITORED") != nullptr)
    idist::monitored_barrier({.timeout = std::chrono::seconds(10), .group = {}});
  idist::finalize();
  if (rank == 0)
    std::printf("reform_rank: done steps=%d redone=%d reforms=%d world=%d sum=%.0f\n", steps, redone, reforms, world,
                sum);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "reform_rank: %s\n", e.what());
  return 1;
}
