// Ranks that get stuck on purpose, for idist-run's stall reports (stall.sh):
//   stall_rank loop ROUNDS PAUSE_MS         all_reduce ROUNDS times (SIGSTOP one from outside)
//   stall_rank sleep RANK SECONDS           that rank sleeps in its own code before round 3
//   stall_rank skip_barrier RANK            that rank skips the barrier after round 3
//   stall_rank count RANK                   that rank's round-3 all_reduce has another count
//   stall_rank dtype RANK                   that rank's round-3 all_reduce is of int32, not float32
//   stall_rank recv RANK SECONDS            rank 0 receives from that rank in round 3, which sleeps
//                                           SECONDS in its own code before it sends
//                                           (the same bytes: gloo over TCP completes it, wrongly)
// Every rank prints its pid first ("rank R pid P"), so that a test can signal it.
#include <idist/idist.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: stall_rank loop ROUNDS PAUSE_MS | sleep RANK SECONDS | skip_barrier RANK | count RANK | dtype RANK | recv RANK SECONDS\n");
    return 2;
  }
  const std::string mode = argv[1];
  idist::init();
  const int rank = idist::get_rank();
  std::printf("rank %d pid %d\n", rank, static_cast<int>(::getpid()));
  std::fflush(stdout);
  const int rounds = mode == "loop" ? std::stoi(argv[2]) : 6;
  const int pause_ms = mode == "loop" && argc > 3 ? std::stoi(argv[3]) : 20;
  const int who = mode == "loop" ? -1 : std::stoi(argv[2]);
  for (int i = 0; i < rounds; ++i) {
    if (i == 3 && rank == who && mode == "sleep") std::this_thread::sleep_for(std::chrono::seconds(std::stoi(argv[3])));
    if (i == 3 && mode == "recv") {
      std::vector<float> message(4, 1.0f);
      if (rank == who) {
        std::this_thread::sleep_for(std::chrono::seconds(std::stoi(argv[3])));
        idist::send(message, 0, 7);
      } else if (rank == 0) {
        idist::recv(std::span<float>(message), who, 7);
      }
    }
    std::vector<float> x(i == 3 && rank == who && mode == "count" ? 3 : 2, 1.0f);
    if (i == 3 && rank == who && mode == "dtype") {
      std::vector<std::int32_t> y(2, 1);
      idist::all_reduce(y);
    } else {
      idist::all_reduce(x);
    }
    if (i == 3 && !(rank == who && mode == "skip_barrier")) idist::barrier();
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  std::printf("rank %d done\n", rank);
  idist::finalize();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
