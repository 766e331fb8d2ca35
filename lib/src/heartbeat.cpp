#include "heartbeat.hpp"

#include <chrono>

namespace idist::detail {

namespace rec = common::recorder;

Heartbeat::Heartbeat(rec::Segment* segment) : segment_(segment) {
  if (segment_ == nullptr) return;
  segment_->beat_ns.store(rec::now_ns(), std::memory_order_release);
  thread_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stop_asked_.wait_for(lock, std::chrono::nanoseconds(rec::kBeatEvery), [this] { return stop_; }))
      segment_->beat_ns.store(rec::now_ns(), std::memory_order_release);
  });
}

Heartbeat::~Heartbeat() {
  if (segment_ == nullptr) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  stop_asked_.notify_all();
  if (thread_.joinable()) thread_.join();
  segment_->beat_ns.store(0, std::memory_order_release);
}

}  // namespace idist::detail
