#pragma once
// How code below ProcessGroup says "refused, and the ranks are still in step" (the error
// protocol of idist/errors.hpp).

#include <stdexcept>
#include <string>

#include "idist/export.hpp"

namespace idist::detail {

// Raised by argument checks, backends and the reduce kernels when a call is refused before
// anything was sent (a (dtype, op) pair the library lacks, an operation the backend does not
// have), or when what was sent has been consumed in step (a receive of the wrong length, which
// the backend drained). Every rank concerned stays where the protocol expects it, so
// ProcessGroup::run turns it into idist::Error and leaves the group usable; any other
// exception from a backend marks the group broken. Its own type, rather than
// std::invalid_argument, so that a std::invalid_argument from deeper down (a parse inside a
// library) is never mistaken for it. Exported: the backend plugins throw it.
class IDIST_API InStepError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Raised by a backend when a peer this rank waits for in a collective has gone: its process
// exited, its connection closed, or it left the group (finalize) without making the call.
// `member` is the group rank, -1 where the transport cannot tell which. ProcessGroup asks the
// runtime what that peer said as it left (finalize's note in the store), so the error names
// what happened ("rank 1 called finalize() after 6 steps ...") rather than a lost socket.
// `seen`: the group rank whose connection closed here, where the transport knows it but not
// whether that peer is the one that left (gloo: a neighbour that raised closes its socket too).
class IDIST_API PeerLostFailure : public std::runtime_error {
 public:
  PeerLostFailure(int member, const std::string& what, int seen = -1)
      : std::runtime_error(what), member_(member), seen_(seen) {}
  int member() const { return member_; }
  int seen() const { return seen_; }

 private:
  int member_;
  int seen_;
};

// A wait ended by this rank's own abort (Backend::abort): no peer left, so nothing to ask the
// store about who did.
class IDIST_API AbortedFailure : public PeerLostFailure {
 public:
  using PeerLostFailure::PeerLostFailure;
};

}  // namespace idist::detail
