#include <spdlog/fmt/fmt.h>

#include "common/duration.hpp"
#include "work_state.hpp"

namespace idist {

Work::Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}

void Work::wait() {
  if (state_) state_->done.get();
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!state_) return;
  if (state_->done.wait_for(timeout) != std::future_status::ready)
    throw TimeoutError(state_->site, "not complete after " + detail::duration_text(timeout) +
                                                 " (it goes on; wait again to keep waiting)");
  state_->done.get();
}

bool Work::is_completed() const {
  return !state_ || state_->done.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace idist
