// The argument check behind one_rank_only and one_rank_first; the rest is in the header.
#include <string>

#include "idist/helpers.hpp"

namespace idist::detail {

void check_rank_in_range(const char* what, int rank, int size, const char* size_name) {
  if (rank < 0 || rank >= size)
    refuse(what, "rank=" + std::to_string(rank) + " is not a rank (" + size_name + " " + std::to_string(size) + ")");
}

}  // namespace idist::detail
