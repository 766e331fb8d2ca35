// The tutorial's broadcast: rank 0's message replaces every other rank's.
#include <idist/idist.hpp>

#include "print.hpp"

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  std::string message = "hello from rank " + std::to_string(rank);
  examples::say("Rank " + std::to_string(rank) + ", Initial value: " + message);
  message = idist::broadcast(message, 0);
  examples::say("Rank " + std::to_string(rank) + ", After performing broadcast: " + message);
  idist::finalize();
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
