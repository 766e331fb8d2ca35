// The tutorial's all_reduce in the tutorial's own form:
//   idist.spawn(backend="gloo", fn=all_reduce_example, args=(), nproc_per_node=3)
// Run plainly, it starts its 3 ranks itself; under idist-run -n 3, srun -n 3 or mpirun -np 3
// it finds the ranks already started and only initialises. Every rank ends with [9, 12].
#include <idist/launch.hpp>

#include "print.hpp"

void all_reduce_example(int local_rank) {
  std::vector<std::int64_t> tensor = {1 + 2 * local_rank, 2 + 2 * local_rank};
  examples::say("Rank " + std::to_string(local_rank) + ", Initial value: " + examples::repr(tensor));
  idist::all_reduce(tensor, idist::ReduceOp::SUM);
  examples::say("Rank " + std::to_string(local_rank) + ", After performing all_reduce: " + examples::repr(tensor));
}

int main() try {
  idist::spawn(all_reduce_example, {.backend = "gloo", .nproc_per_node = 3});
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
