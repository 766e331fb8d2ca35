// Ranks that get stuck on purpose, for idist-run's stall reports (stall.sh):
//   stall_rank loop ROUNDS PAUSE_MS         all_reduce ROUNDS times (SIGSTOP one from outside)
//   stall_rank sleep RANK SECONDS           that rank sleeps in its own code before round 3
//   stall_rank skip_barrier RANK            that rank skips the barrier after round 3
//   stall_rank count RANK                   that rank's round-3 all_reduce has another count
//   stall_rank dtype RANK                   that rank's round-3 all_reduce is of int32, not float32
//   stall_rank max RANK                     that rank's round-3 all_reduce takes the MAX, not the SUM
//   stall_rank recv RANK SECONDS            rank 0 receives from that rank in round 3, which sleeps
//                                           SECONDS in its own code before it sends
//                                           (the same bytes: gloo over TCP completes it, wrongly)
//   stall_rank groups RANK SECONDS          9 groups of every rank (more than the flight recorder
//                                           has rings of their own: the last share one), an
//                                           all_reduce on each; then that rank sleeps SECONDS
//                                           before an all_reduce on group 3, and again on group 8
//   stall_rank threads RANK SECONDS [N]     two threads at once, N times (2000): all_reduce on a group of every rank,
//                                           and send/recv around the world (the recorder's own
//                                           ring and its shared one, written together); then that
//                                           rank sleeps SECONDS before one more group all_reduce
//   stall_rank late RANK AFTER G             10 groups of every rank (the last 3 in the recorder's
//                                           shared ring); that rank's all_reduce on group G (-1:
//                                           the world) is of int32, not float32; then AFTER more
//                                           calls push it out of the recorder (all_reduces on the
//                                           world, or sends around the world for a group)
//   stall_rank first RANK SECONDS           that rank sleeps before its first call on a new group
//   stall_rank flood RANK SECONDS           that rank sleeps before an all_reduce on group 9 (in the
//                                           shared ring) while a thread of every rank sends
//                                           around the world (in the same ring)
//   stall_rank healthy SECONDS              a healthy job for SECONDS: phases of 4-7 s of work (sleep
//                                           or spin, unequal between ranks: up to 3 s of waiting in
//                                           the collective after it), then all_reduce, broadcast,
//                                           a ring of send/recv and a barrier
// Every rank prints its pid first ("rank R pid P"), so that a test can signal it. With
// STALL_RANK_RECOVERY set, the ranks init with InitOptions::recovery (a heartbeat idist-run
// watches: heartbeat.sh).
#include <idist/idist.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

// One message of N floats around the world: each rank sends to the next and receives from the
// one before (even ranks send first, so that an odd world cannot deadlock).
void send_around(int rank, int size, std::size_t n) {
  std::vector<float> message(n, static_cast<float>(rank)), got(n);
  if (rank % 2 == 0) {
    idist::send(message, (rank + 1) % size, 1);
    idist::recv(std::span<float>(got), (rank + size - 1) % size, 1);
  } else {
    idist::recv(std::span<float>(got), (rank + size - 1) % size, 1);
    idist::send(message, (rank + 1) % size, 1);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 3) {
    std::fprintf(stderr, "usage: stall_rank loop ROUNDS PAUSE_MS | sleep RANK SECONDS | skip_barrier RANK | count RANK | dtype RANK | max RANK | recv RANK SECONDS | groups RANK SECONDS | threads RANK SECONDS [N] | late RANK AFTER G | first RANK SECONDS | flood RANK SECONDS | healthy SECONDS\n");
    return 2;
  }
  const std::string mode = argv[1];
  idist::init(idist::InitOptions{.recovery = std::getenv("STALL_RANK_RECOVERY") != nullptr});
  const int rank = idist::get_rank();
  std::printf("rank %d pid %d\n", rank, static_cast<int>(::getpid()));
  std::fflush(stdout);
  if (mode == "healthy") {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(std::stoi(argv[2]));
    const int size = idist::get_world_size();
    // Rank 0's clock decides when to stop, for every rank (each deciding alone, they could
    // disagree by a round and wait forever for one another).
    auto go_on = [&] { return idist::broadcast(static_cast<int>(std::chrono::steady_clock::now() < until), 0) != 0; };
    for (int round = 0; go_on(); ++round) {
      const auto work = std::chrono::milliseconds(4000 + 1000 * ((rank + round) % 4));
      if (round % 2 == 0) {
        std::this_thread::sleep_for(work);
      } else {
        const auto end = std::chrono::steady_clock::now() + work;
        volatile double sink = 0;
        while (std::chrono::steady_clock::now() < end) sink = sink + 1.0;
      }
      std::vector<float> x(1000, 1.0f);
      idist::all_reduce(x);
      int value = rank == round % size ? round : -1;
      idist::broadcast(std::span<int>(&value, 1), round % size);
      if (value != round) throw std::runtime_error("broadcast gave " + std::to_string(value));
      send_around(rank, size, 16);
      idist::barrier();
      std::printf("rank %d round %d\n", rank, round);
      std::fflush(stdout);
    }
    idist::finalize();
    return 0;
  }
  if (mode == "groups") {
    std::vector<int> everyone(static_cast<std::size_t>(idist::get_world_size()));
    for (std::size_t r = 0; r < everyone.size(); ++r) everyone[r] = static_cast<int>(r);
    std::vector<idist::Group> groups;
    for (int g = 0; g < 9; ++g) groups.push_back(idist::new_group(everyone));
    std::vector<float> x(2, 1.0f);
    for (const auto& g : groups) idist::all_reduce(x, idist::AllReduceOptions{.group = g});
    for (const std::size_t g : {3u, 8u}) {
      if (rank == std::stoi(argv[2])) std::this_thread::sleep_for(std::chrono::seconds(std::stoi(argv[3])));
      idist::all_reduce(x, idist::AllReduceOptions{.group = groups[g]});
    }
    std::printf("rank %d done\n", rank);
    idist::finalize();
    return 0;
  }
  if (mode == "late" || mode == "first" || mode == "flood") {
    const int size = idist::get_world_size();
    const int who = std::stoi(argv[2]);
    std::vector<int> everyone(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) everyone[static_cast<std::size_t>(r)] = r;
    std::vector<idist::Group> groups;
    for (int g = 0; g < 10; ++g) groups.push_back(idist::new_group(everyone));
    std::vector<float> x(2, 1.0f);
    if (mode == "late") {
      const int g = std::stoi(argv[4]);
      const idist::AllReduceOptions on{.group = g < 0 ? idist::Group{} : groups[static_cast<std::size_t>(g)]};
      if (rank == who) {
        std::vector<std::int32_t> y(2, 1);
        idist::all_reduce(y, on);
      } else {
        idist::all_reduce(x, on);
      }
      for (int i = 0; i < std::stoi(argv[3]); ++i) {
        if (g < 0) {
          idist::all_reduce(x);
        } else {
          send_around(rank, size, 4);
        }
      }
    } else if (mode == "first") {
      if (rank == who) std::this_thread::sleep_for(std::chrono::seconds(std::stoi(argv[3])));
      idist::all_reduce(x, idist::AllReduceOptions{.group = groups[0]});
    } else {
      for (const auto& g : groups) idist::all_reduce(x, idist::AllReduceOptions{.group = g});
      std::thread sender([&] {
        for (int i = 0; i < 300; ++i) send_around(rank, size, 4);
      });
      if (rank == who) std::this_thread::sleep_for(std::chrono::seconds(std::stoi(argv[3])));
      idist::all_reduce(x, idist::AllReduceOptions{.group = groups[9]});
      sender.join();
    }
    std::printf("rank %d done\n", rank);
    idist::finalize();
    return 0;
  }
  if (mode == "threads") {
    const int size = idist::get_world_size();
    std::vector<int> everyone(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) everyone[static_cast<std::size_t>(r)] = r;
    const idist::Group group = idist::new_group(everyone);
    const int rounds = argc > 4 ? std::stoi(argv[4]) : 2000;
    std::thread ring([&] {
      for (int i = 0; i < rounds; ++i) send_around(rank, size, 4);
    });
    std::vector<float> x(2, 1.0f);
    for (int i = 0; i < rounds; ++i) {
      x.assign(2, 1.0f);
      idist::all_reduce(x, idist::AllReduceOptions{.group = group});
      if (x[0] != static_cast<float>(size)) throw std::runtime_error("all_reduce gave " + std::to_string(x[0]));
    }
    ring.join();
    if (rank == std::stoi(argv[2])) std::this_thread::sleep_for(std::chrono::seconds(std::stoi(argv[3])));
    idist::all_reduce(x, idist::AllReduceOptions{.group = group});
    std::printf("rank %d done\n", rank);
    idist::finalize();
    return 0;
  }
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
    } else if (i == 3 && rank == who && mode == "max") {
      idist::all_reduce(x, idist::ReduceOp::MAX);
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
