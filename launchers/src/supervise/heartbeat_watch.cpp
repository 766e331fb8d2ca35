#include "heartbeat_watch.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include "idist/common/duration.hpp"

namespace idist::launchers::supervision {

namespace {

// A tenth of the default timeout: a frozen rank is named within 0.1 s of it.
constexpr auto kHeartbeatCheck = std::chrono::milliseconds(100);

}  // namespace

std::optional<std::chrono::duration<double>> frozen_for(std::int64_t beat_ns, std::int64_t now_ns,
                                                        std::chrono::milliseconds timeout) {
  if (beat_ns == 0 || timeout.count() <= 0) return std::nullopt;
  const std::chrono::duration<double> silent = std::chrono::nanoseconds(now_ns - beat_ns);
  if (silent <= timeout) return std::nullopt;
  return silent;
}

void stop_frozen(Rank& rank, std::chrono::duration<double> silent, std::chrono::milliseconds timeout) {
  rank.record->frozen_for = silent;
  spdlog::error("rank {} (pid {}) is frozen: no heartbeat for {} (--heartbeat-timeout {}): stopping it (SIGKILL)",
                rank.spec->rank, rank.record->pid, common::measured_duration_text(silent),
                common::duration_text(timeout));
  ::kill(-rank.record->pid, SIGKILL);
}

void HeartbeatWatch::start(std::function<LiveAttempt*()> watched,
                           std::function<void(Rank&, std::chrono::duration<double>)> frozen) {
  if (timeout_.count() <= 0) return;
  watched_ = std::move(watched);
  frozen_ = std::move(frozen);
  check();
}

void HeartbeatWatch::stop() {
  stopped_ = true;
  timer_.cancel();
}

void HeartbeatWatch::check() {
  if (stopped_) return;
  if (LiveAttempt* attempt = watched_(); attempt != nullptr) {
    const auto now = common::recorder::now_ns();
    for (auto& rank : attempt->ranks) {
      if (!rank.running() || !rank.recorder || rank.record->frozen_for) continue;
      if (const auto silent = frozen_for(rank.recorder->beat_ns(), now, timeout_)) frozen_(rank, *silent);
    }
  }
  timer_.expires_after(kHeartbeatCheck);
  timer_.async_wait([this](auto ec) {
    if (!ec) check();
  });
}

}  // namespace idist::launchers::supervision
