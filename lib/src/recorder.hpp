#pragma once
// This process's flight recorder: every collective a group runs is entered here before it
// starts and marked when it ends, in the memory idist-run reads (IDIST_RECORDER_FD), so that a
// stall can be reported from outside the rank even while it is frozen.

#include <cstdint>
#include <string_view>

#include "idist/common/flight_recorder.hpp"
#include "idist/types.hpp"

namespace idist::detail {

class Recorder {
 public:
  // A slot's position, for leave().
  using Mark = std::uint64_t;
  Mark enter(std::uint32_t epoch, std::int32_t group, std::uint64_t seq, std::string_view op, DType dtype, std::uint64_t count,
             std::int32_t root, common::recorder::Kind kind = common::recorder::Kind::collective) noexcept;
  void leave(Mark mark, bool ok) noexcept;
};

Recorder& recorder();

}  // namespace idist::detail
