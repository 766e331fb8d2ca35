#pragma once
// The one way idist::torch reports a bad call: idist::Error, named like libidist's own
// ("[idist rank r/n] op(backend): ..."), so that a training script sees one kind of error.

#include <string>
#include <string_view>

#include "idist/idist.hpp"

namespace idist::detail {

[[noreturn]] inline void refuse(std::string_view op, const std::string& why) {
  throw Error(ErrorSite{get_rank(), get_world_size(), std::string(op), backend()}, why);
}

}  // namespace idist::detail
