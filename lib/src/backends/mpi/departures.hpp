#pragma once
// MPI has no store in which a rank could say that it left: a rank that leaves a communicator
// (finalize) tells the other members on the backend's internal communicator, with the number
// of collectives it began there and finalize's note. A member whose wait lasts reads the
// notices, and fails where a leaver never began the call it waits in, instead of waiting out
// its timeout; a leaver that did begin it has sent its part, and the wait goes on.

// The C API only, as mpi_backend.cpp.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdint>
#include <map>
#include <string>

namespace idist::detail::mpi {

inline constexpr int kLeaveTag = 1;  // on the internal communicator; the small all_reduce uses 0

class Departures {
 public:
  // Tells every other member of `comm` that this rank leaves, having begun `calls`
  // collectives; waits at most 200 ms for MPI to take the notices (small ones leave eagerly).
  static void announce(MPI_Comm comm, int rank, int size, std::uint64_t calls, const std::string& note);

  // Reads the notices that came; throws PeerLostFailure naming a member that left without
  // beginning the call this rank waits in (its `calls`-th).
  void check(MPI_Comm comm, std::uint64_t calls);

 private:
  struct Departure {
    std::uint64_t calls = 0;
    std::string note;
  };
  std::map<int, Departure> departed_;
};

}  // namespace idist::detail::mpi
