#include "heartbeat.hpp"

#include <unistd.h>

#include <chrono>

namespace idist::detail {

namespace rec = common::recorder;

Heartbeat::Heartbeat(rec::Segment* segment) : segment_(segment), owner_(::getpid()) {
  if (segment_ == nullptr) return;
  segment_->beat_pid.store(static_cast<std::int32_t>(owner_), std::memory_order_release);
  try {
    thread_ = std::make_unique<std::thread>([this] {
      std::unique_lock lock(mu_);
      do segment_->beat_ns.store(rec::now_ns(), std::memory_order_release);
      while (!stop_asked_.wait_for(lock, std::chrono::nanoseconds(rec::kBeatEvery), [this] { return stop_; }));
    });
  } catch (const std::system_error&) {
    segment_->beat_pid.store(0, std::memory_order_release);
    segment_ = nullptr;  // no thread to beat: nothing for idist-run to watch
  }
}

Heartbeat::~Heartbeat() {
  if (segment_ == nullptr) return;
  // A child forked without exec that runs its destructors has the object, not the thread, and
  // the stamp is its parent's.
  if (::getpid() != owner_) {
    (void)thread_.release();
    return;
  }
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  stop_asked_.notify_all();
  thread_->join();
  segment_->beat_pid.store(0, std::memory_order_relaxed);
  segment_->admits_pid.store(0, std::memory_order_relaxed);
  segment_->beat_ns.store(0, std::memory_order_release);
}

}  // namespace idist::detail
