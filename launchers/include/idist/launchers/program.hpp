#pragma once

#include <stdexcept>
#include <string>

namespace idist::launchers {

// A usage error: idist-run prints it as one line and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The executable `name` names: a path when it contains '/', else the first match in PATH, as
// execvp would find it. Throws UsageError when it does not exist, is a directory, or is not
// executable, so the job fails before any rank starts rather than N times after.
std::string resolve_program(const std::string& name);

}  // namespace idist::launchers
