// A job with its own input: every rank adds (rank + 1) * VALUE, ROUNDS times, with a pause
// between rounds so that two jobs started together overlap. Each rank checks every sum
// against the closed form VALUE * N (N + 1) / 2 and prints one line; a sum that mixes two
// jobs' values is reported WRONG and the rank exits 3.
// usage: job_sum [ROUNDS=20 PAUSE_MS=25] VALUE   (the value last, so a test can append it)
// JOB_SUM_CRASH=RANK:ROUND[:ATTEMPT],...: in that attempt (IDIST_RESTART_COUNT; 0 by default)
// that rank exits with code 7 before that round, while the others are computing (_Exit: as a
// crash, no exit handlers). JOB_SUM_EXIT=CODE makes it std::exit(CODE) instead, as a program
// that gives up (7), or returns early (0).
#include <idist/idist.hpp>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

int main(int argc, char** argv) try {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: job_sum [ROUNDS PAUSE_MS] VALUE\n");
    return 2;
  }
  const std::int64_t value = std::stoll(argv[argc - 1]);
  const int rounds = argc == 4 ? std::stoi(argv[1]) : 20;
  const int pause_ms = argc == 4 ? std::stoi(argv[2]) : 25;
  idist::init();
  const std::int64_t n = idist::get_world_size();
  const int rank = idist::get_rank();
  const std::int64_t want = value * n * (n + 1) / 2;
  std::int64_t got = 0;
  int wrong = 0;
  int crash_rank = -1;
  int crash_round = 0;
  const char* restart = std::getenv("IDIST_RESTART_COUNT");
  const int attempt = restart ? std::atoi(restart) : 0;
  if (const char* crash = std::getenv("JOB_SUM_CRASH")) {
    for (const char* spec = crash; spec != nullptr && *spec != '\0';) {
      int r = -1, round = 0, at = 0;
      if (std::sscanf(spec, "%d:%d:%d", &r, &round, &at) >= 2 && r == rank && at == attempt) {
        crash_rank = r;
        crash_round = round;
      }
      spec = std::strchr(spec, ',');
      if (spec != nullptr) ++spec;
    }
  }
  for (int i = 0; i < rounds; ++i) {
    if (rank == crash_rank && i == crash_round) {
      std::fprintf(stderr, "job_sum: rank %d crashes before round %d (JOB_SUM_CRASH)\n", rank, i);
      if (const char* code = std::getenv("JOB_SUM_EXIT")) std::exit(std::atoi(code));
      std::_Exit(7);
    }
    std::vector<std::int64_t> x = {value * (rank + 1)};
    idist::all_reduce(x);
    got = x[0];
    if (got != want) ++wrong;
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  const char* port = std::getenv("MASTER_PORT");
  std::printf("job %" PRId64 " rank %d/%" PRId64 " port %s attempt %s sum %" PRId64 " %s\n", value, rank, n,
              port ? port : "-", restart ? restart : "-", got,
              wrong == 0 ? "right" : ("WRONG in " + std::to_string(wrong) + " rounds, want " + std::to_string(want)).c_str());
  std::fflush(stdout);
  idist::finalize();
  return wrong == 0 ? 0 : 3;
} catch (const idist::PeerLostError& e) {
  // The type a program that recovers catches, and the rank it names (tests/e2e/peer_death.sh).
  std::fprintf(stderr, "%s\njob_sum: PeerLostError lost_rank=%d\n", e.what(), e.lost_rank());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
