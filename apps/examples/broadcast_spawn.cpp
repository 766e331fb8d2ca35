// The tutorial's broadcast in the tutorial's own form:
//   idist.spawn(backend="gloo", fn=broadcast_example, args=(), nproc_per_node=3)
// Every rank ends with "hello from rank 0". Started plainly or by a launcher, as all_reduce_spawn.
#include <idist/launch.hpp>

#include "print.hpp"

void broadcast_example(int local_rank) {
  std::string message = "hello from rank " + std::to_string(idist::get_rank());
  examples::say("Rank " + std::to_string(local_rank) + ", Initial value: " + message);
  message = idist::broadcast(message, 0);
  examples::say("Rank " + std::to_string(local_rank) + ", After performing broadcast: " + message);
}

int main() try {
  idist::spawn(broadcast_example, {.backend = "gloo", .nproc_per_node = 3});
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
