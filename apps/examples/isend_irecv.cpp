// "Pytorch - 3 Distributed Computing", non-blocking point-to-point: isend/irecv return at once;
// the tensor must not be touched until wait() says the transfer is done.
#include <idist/idist.hpp>

#include "print.hpp"

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  std::vector<float> tensor = {0.0f};
  idist::Work request;  // ranks other than 0 and 1 take no part: an already complete Work
  if (rank == 0) {
    tensor[0] += 1;
    request = idist::isend(tensor, /*dst=*/1);
    examples::say("Rank 0 started sending");
  } else if (rank == 1) {
    request = idist::irecv(tensor, /*src=*/0);
    examples::say("Rank 1 started receiving");
  }
  request.wait();
  examples::say("Rank " + std::to_string(rank) + " has data " + examples::repr(tensor[0]));
  idist::finalize();
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
