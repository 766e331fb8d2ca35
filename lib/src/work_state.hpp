#pragma once
// What a Work handle shares with the thread that completes its operation.

#include <future>

#include "idist/errors.hpp"
#include "idist/work.hpp"

namespace idist::detail {

struct WorkState {
  std::shared_future<void> done;  // holds the operation's idist::Error, if it failed
  ErrorSite site;                 // for a timeout of wait() itself
};

}  // namespace idist::detail
