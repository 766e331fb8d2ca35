#include "heartbeat_watch.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <string>

#include "idist/common/duration.hpp"

namespace idist::launchers::supervision {

namespace {

// A tenth of the shortest timeout (1 s): a frozen rank is named within 0.1 s of it.
constexpr auto kHeartbeatCheck = std::chrono::milliseconds(100);
// A check this late means idist-run itself did not run (the whole job paused): silence is
// counted afresh.
constexpr std::int64_t kPausedNs = 1'000'000'000;

enum class Beater { running, gone, traced };

// The beating process as /proc has it: gone (or a zombie: an earlier life of the rank, killed),
// traced (gdb stops every thread it attaches to), or there to judge.
Beater beater(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  bool seen_state = false;
  while (std::getline(status, line)) {
    if (line.rfind("State:", 0) == 0) {
      seen_state = true;
      if (line.find('Z') != std::string::npos || line.find('X') != std::string::npos) return Beater::gone;
    } else if (line.rfind("TracerPid:", 0) == 0) {
      return std::stol(line.substr(10)) != 0 ? Beater::traced : Beater::running;
    }
  }
  return seen_state ? Beater::running : Beater::gone;
}

}  // namespace

std::optional<std::chrono::duration<double>> frozen_for(BeatSeen& seen, std::int64_t stamp, std::int64_t now_ns,
                                                        std::chrono::milliseconds timeout) {
  if (stamp == 0 || timeout.count() <= 0 || stamp != seen.stamp) {
    seen.stamp = stamp;
    seen.since_ns = now_ns;
    return std::nullopt;
  }
  const std::chrono::duration<double> silent = std::chrono::nanoseconds(now_ns - seen.since_ns);
  if (silent <= timeout) return std::nullopt;
  return silent;
}

bool began_beating(BeatSeen& seen, pid_t pid) {
  const bool began = pid != 0 && pid != seen.beating;
  seen.beating = pid;
  return began;
}

void stop_frozen(Rank& rank, pid_t pid, std::chrono::duration<double> silent, std::chrono::milliseconds timeout) {
  rank.record->frozen_for = silent;
  spdlog::error("rank {} (pid {}) is frozen: no heartbeat for {} (--heartbeat-timeout {}): stopping it (SIGKILL)",
                rank.spec->rank, pid, common::measured_duration_text(silent), common::duration_text(timeout));
  ::kill(-rank.record->pid, SIGKILL);
}

void HeartbeatWatch::start(std::function<LiveAttempt*()> watched, Frozen frozen, Began began) {
  watched_ = std::move(watched);
  frozen_ = std::move(frozen);
  began_ = std::move(began);
  check();
}

void HeartbeatWatch::stop() {
  stopped_ = true;
  timer_.cancel();
}

void HeartbeatWatch::check() {
  if (stopped_) return;
  const auto now = common::recorder::now_ns();
  if (last_check_ns_ != 0 && now - last_check_ns_ > kPausedNs)
    for (auto& [record, seen] : seen_) seen.since_ns = now;
  last_check_ns_ = now;
  if (LiveAttempt* attempt = watched_(); attempt != nullptr) {
    for (auto& rank : attempt->ranks) {
      if (!rank.running() || !rank.recorder || rank.record->frozen_for) continue;
      auto& seen = seen_[rank.record];
      const bool admitting = rank.recorder->admits_pid() != 0 && !std::exchange(seen.admitting, true);
      if ((began_beating(seen, rank.recorder->beat_pid()) || admitting) && began_) began_(*attempt, rank);
      const auto silent = frozen_for(seen, rank.recorder->beat_ns(), now, timeout_);
      if (!silent) continue;
      const pid_t pid = rank.recorder->beat_pid();
      const auto who = pid > 0 ? beater(pid) : Beater::gone;
      if (who == Beater::running) {
        frozen_(rank, pid, *silent);
      } else if (who == Beater::traced) {
        seen.since_ns = now;  // a full timeout again once the debugger lets go
      }
    }
  }
  timer_.expires_after(kHeartbeatCheck);
  timer_.async_wait([this](auto ec) {
    if (!ec) check();
  });
}

}  // namespace idist::launchers::supervision
