// An installed idist::spawn: the program starts its own 2 ranks (idist::launch).
#include <idist/launch.hpp>

#include <cstdio>

int main() try {
  idist::spawn(
      [](int local_rank) {
        const int n = idist::get_world_size();
        std::vector<std::int64_t> v = {local_rank, 1};
        idist::all_reduce(v);
        if (idist::get_rank() == 0)
          std::printf("spawn consumer: %d ranks, all_reduce %s\n", n, v[0] == n * (n - 1) / 2 && v[1] == n ? "right" : "WRONG");
      },
      {.backend = "gloo", .nproc_per_node = 2});
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
