// The tutorial's all_reduce: every rank holds [1, 2] + 2*rank; after a SUM over 3 ranks every
// rank holds [9, 12].
#include <idist/idist.hpp>

#include "print.hpp"

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  std::vector<std::int64_t> tensor = {1 + 2 * rank, 2 + 2 * rank};
  examples::say("Rank " + std::to_string(rank) + ", Initial value: " + examples::repr(tensor));
  idist::all_reduce(tensor, idist::ReduceOp::SUM);
  examples::say("Rank " + std::to_string(rank) + ", After performing all_reduce: " + examples::repr(tensor));
  idist::finalize();
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
