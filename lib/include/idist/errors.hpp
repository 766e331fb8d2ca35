#pragma once
// Errors raised by libidist. Every error says who raised it and in which call:
//   [idist rank 3/8] all_gather(gloo): connection closed by peer
// so that a log line from one rank of a large job is enough to start debugging.

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

// A peer or the store did not answer within the timeout (IDIST_TIMEOUT). After a timeout
// inside a collective the backend's connections are in an unknown state: later collectives
// raise Error rather than risk a silent mismatch.
class IDIST_API TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace idist
