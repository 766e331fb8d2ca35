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

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace idist::detail::mpi {

inline constexpr int kLeaveTag = 1;      // on the internal communicator; the small all_reduce uses 0
inline constexpr int kAbandonedTag = 2;  // a member left waiting, to the one that left it

class Departures {
 public:
  // Tells every other member of `comm` that this rank leaves, having begun `calls`
  // collectives; waits at most 200 ms for MPI to take the notices (small ones leave eagerly).
  static void announce(MPI_Comm comm, int rank, int size, std::uint64_t calls, const std::string& note);

  // Reads the notices that came; throws PeerLostFailure naming a member that left without
  // beginning the call this rank waits in (its `calls`-th), after telling it so (`rank` is
  // this one, `op` the call: "all_reduce").
  void check(MPI_Comm comm, int rank, std::uint64_t calls);

  // finalize(), after announce(): waits (bounded) until every other member has left too, as
  // the store's finalize does; returns what a member left waiting said ("<rank>\t<call>"), or
  // "" when none was. `calls`: the collectives this rank began; a member whose own notice says
  // it began more was left waiting in one of them, even where its word never came (its send
  // is cancelled after 200 ms, which a loaded machine has taken).
  std::string await_the_others(MPI_Comm comm, int size, std::uint64_t calls, std::chrono::milliseconds timeout);

 private:
  struct Departure {
    std::uint64_t calls = 0;
    std::string note;
  };
  // The notices that came, into departed_.
  void read_notices(MPI_Comm comm);
  std::map<int, Departure> departed_;
};

}  // namespace idist::detail::mpi
