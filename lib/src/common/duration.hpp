#pragma once
// libidist's name for the one way durations are printed (idist/common/duration.hpp).

#include "idist/common/duration.hpp"

namespace idist::detail {
using common::duration_text;
using common::timed_out;
}  // namespace idist::detail
