// The tutorial's all_gather: every rank contributes 2.0*rank and receives every rank's value.
#include <idist/idist.hpp>

#include "print.hpp"

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  const double num = 2.0 * rank;
  examples::say("Rank " + std::to_string(rank) + ", Initial value: " + examples::repr(num));
  const auto all_nums = idist::all_gather(num);
  examples::say("Rank " + std::to_string(rank) + ", After performing all_gather: " + examples::repr(all_nums));
  idist::finalize();
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
