// The tutorial's all_gather in the tutorial's own form:
//   idist.spawn(backend="gloo", fn=all_gather_example, args=(), nproc_per_node=3)
// Every rank ends with [0.0, 2.0, 4.0]. Started plainly or by a launcher, as all_reduce_spawn.
#include <idist/launch.hpp>

#include "print.hpp"

void all_gather_example(int local_rank) {
  const double num = 2.0 * idist::get_rank();
  examples::say("Rank " + std::to_string(local_rank) + ", Initial value: " + examples::repr(num));
  const auto all_nums = idist::all_gather(num);
  examples::say("Rank " + std::to_string(local_rank) + ", After performing all_gather: " + examples::repr(all_nums));
}

int main() try {
  idist::spawn(all_gather_example, {.backend = "gloo", .nproc_per_node = 3});
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
