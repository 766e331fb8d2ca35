// "Pytorch - 3 Distributed Computing", all_reduce over a group: ranks 0 and 1 sum their ones
// and hold 2.0; any other rank is outside the group and keeps its 1.0.
#include <idist/idist.hpp>

#include "print.hpp"

int main() try {
  idist::init();
  const int rank = idist::get_rank();
  if (idist::get_world_size() < 2)
    throw std::runtime_error("group_all_reduce: needs at least 2 ranks (idist-run -n 3 group_all_reduce)");
  // Every rank makes the group, members or not: new_group is a collective over the world.
  const idist::Group group = idist::new_group({0, 1});
  std::vector<float> tensor = {1.0f};
  idist::all_reduce(tensor, {.op = idist::ReduceOp::SUM, .group = group});
  examples::say("Rank " + std::to_string(rank) + " has data " + examples::repr(tensor[0]));
  idist::finalize();
  const float expected = group.is_member() ? 2.0f : 1.0f;
  return tensor[0] == expected ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
