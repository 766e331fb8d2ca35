#pragma once
// Errors raised by libidist. Every error says who raised it and in which call:
//   [idist rank 3/8] all_gather(gloo): connection closed by peer
// so that a log line from one rank of a large job is enough to start debugging.
//
// The error protocol. A public call of libidist (idist.hpp, helpers.hpp, types.hpp) raises
// idist::Error or a subclass, never a std exception of its own, and idist::torch reports its
// bad calls the same way. What a backend or a library below it throws is converted on its
// way out (for the collectives in one place, ProcessGroup::run in lib/src/process_group.cpp);
// exceptions of the caller's own (fn of one_rank_only) pass through untouched. What an Error
// says about the group the call was made on:
//  - an argument refused (a root out of range, a buffer of the wrong size, AVG on integers, an
//    operation the backend does not have, a receive buffer of another length than what was
//    sent, which the backend drained): nothing was sent, or what was sent was consumed in
//    step. The group stays usable; the next call works. The typed templates check through
//    detail::refuse (idist.hpp), the library's own checks are in ProcessGroup, both before
//    anything is sent. A check fails on every rank that passed the bad argument; where only
//    some ranks did, the others are inside the collective and get TimeoutError after
//    IDIST_TIMEOUT (under IDIST_DEBUG=1 the library's checks are compared across ranks
//    first, so that every rank raises at once).
//  - TimeoutError from a collective: peers did not arrive within IDIST_TIMEOUT. The
//    connections are in an unknown state: the group is unusable. (Work::wait(timeout)'s
//    TimeoutError is the caller's own deadline: the operation goes on.)
//  - any other Error from inside a collective: the group is unusable, and every later call on
//    it raises "unusable after an earlier failure: ...". PeerLostError is this kind where a
//    peer is gone (it died, was killed, or left the group), naming it.
// Inside the library the first kind is detail::InStepError (lib/src/in_step_error.hpp), the
// second detail::TimeoutFailure, detail::PeerLostFailure the third's PeerLostError, and any
// other exception is the third: no std type carries
// the distinction, so a std::invalid_argument from deep inside counts as a broken group.
// env::ContractError (env_contract.hpp), the parse error the launcher shares with the
// library, reaches a program as Error from init() ("init: bad environment: ...").

#include <stdexcept>
#include <string>

#include "idist/export.hpp"

namespace idist {

// Where an error happened. rank is -1 before the rank is known (bad environment).
struct ErrorSite {
  int rank = -1;
  int world_size = 0;
  std::string op;       // "init", "all_reduce", ...
  std::string backend;  // "gloo", ... or empty before init picked one
};

class IDIST_API Error : public std::runtime_error {
 public:
  Error(ErrorSite site, const std::string& detail);
  const ErrorSite& site() const noexcept { return site_; }
  int rank() const noexcept { return site_.rank; }
  const std::string& op() const noexcept { return site_.op; }
  const std::string& backend() const noexcept { return site_.backend; }
  // The message without the "[idist rank r/n] op(backend): " prefix.
  const std::string& detail() const noexcept { return detail_; }

 private:
  ErrorSite site_;
  std::string detail_;
};

// A peer this rank waited for inside a collective is gone: its process exited or was killed,
// its connection closed, or it left the group (finalize) without making the call. The group is
// unusable after it, as after any failure inside a collective (see above). lost_rank() is the
// world rank of that peer: the one that left where the runtime knows (finalize's note, the
// shared-memory and mpi transports), else the one whose connection closed here (over gloo's
// TCP a survivor may see a neighbour's socket close first), -1 where nothing says which.
class IDIST_API PeerLostError : public Error {
 public:
  PeerLostError(ErrorSite site, const std::string& detail, int lost_rank);
  int lost_rank() const noexcept { return lost_rank_; }

 private:
  int lost_rank_;
};

// A peer or the store did not answer within the timeout (IDIST_TIMEOUT). After a timeout
// inside a collective the backend's connections are in an unknown state: later collectives
// raise Error rather than risk a silent mismatch.
class IDIST_API TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace idist
