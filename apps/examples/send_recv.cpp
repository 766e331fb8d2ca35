// "Pytorch - 3 Distributed Computing", blocking point-to-point: rank 0 sends a tensor holding
// 1.0 to rank 1, which receives it. Every rank then prints "Rank r has data 1.0"; ranks other
// than 0 and 1 keep their 0.0.
#include <idist/idist.hpp>

#include "print.hpp"

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  std::vector<float> tensor = {0.0f};
  if (rank == 0) {
    tensor[0] += 1;
    idist::send(tensor, /*dst=*/1);
  } else if (rank == 1) {
    idist::recv(tensor, /*src=*/0);
  }
  examples::say("Rank " + std::to_string(rank) + " has data " + examples::repr(tensor[0]));
  idist::finalize();
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
