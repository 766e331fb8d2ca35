#include "stall_watch.hpp"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <memory>
#include <thread>

namespace idist::launchers::supervision {

namespace {

// How often the recorders are read: often enough that a stall is reported within a second of
// its timeout, rarely enough to cost nothing.
constexpr auto kStallCheck = std::chrono::milliseconds(500);

}  // namespace

StallWatch::StallWatch(asio::io_context& io, const SuperviseOptions& options, std::string host)
    : io_(io), options_(options), host_(std::move(host)), timer_(io) {
  mailbox_->io = &io_;
}

void StallWatch::start(std::function<LiveAttempt*()> watched, std::function<void(detail::StallReport)> stalled) {
  watched_ = std::move(watched);
  stalled_ = std::move(stalled);
  check();
}

void StallWatch::stop() {
  stopped_ = true;
  timer_.cancel();
}

void StallWatch::new_attempt() {
  stalls_reported_.clear();
  mismatches_reported_.clear();
  mismatches_held_.clear();
}

std::vector<detail::RankView> StallWatch::views(LiveAttempt& attempt) {
  std::vector<detail::RankView> views;
  for (auto& r : attempt.ranks) {
    if (r.record->pid <= 0) continue;
    detail::RankView v;
    v.rank = r.spec->rank;
    v.pid = r.record->pid;
    v.running = r.running();
    if (!v.running && r.record->status) v.ended = detail::describe(*r.record->status);
    if (r.recorder) {
      v.slots = r.recorder->read();
      v.pid = r.recorder->recording(v.pid);
    }
    views.push_back(std::move(v));
  }
  return views;
}

void StallWatch::check_mismatches(LiveAttempt& attempt, bool running) {
  for (const auto& line : detail::mismatch_report(views(attempt), mismatches_reported_, &mismatches_held_, running))
    spdlog::error("{}", line);
}

void StallWatch::check() {
  if (stopped_) return;
  if (LiveAttempt* attempt = watched_(); attempt != nullptr) {
    const auto now = views(*attempt);
    if (options_.stall_timeout.count() > 0) {
      for (const auto& line : detail::mismatch_report(now, mismatches_reported_, &mismatches_held_, true))
        spdlog::error("{}", line);
      if (auto report = detail::stall_report(now, common::recorder::now_ns(), options_.stall_timeout, stalls_reported_))
        stalled_(std::move(*report));
    }
  }
  timer_.expires_after(kStallCheck);
  timer_.async_wait([this](auto ec) {
    if (!ec) check();
  });
}

void StallWatch::inspect_stacks(const std::vector<std::pair<int, pid_t>>& ranks,
                                std::function<void(std::vector<std::string>)> done) {
  if (ranks.empty() || !options_.stacks || !detail::stack_tool_available()) return done({});
  std::thread([mailbox = mailbox_, ranks, done = std::move(done)]() mutable {
    std::vector<std::string> lines;
    for (const auto& [rank, pid] : ranks) {
      const auto stack = detail::stack_of(pid);
      if (stack.empty()) continue;
      lines.push_back(fmt::format("stall: rank {} (pid {}), its threads' stacks (gdb):", rank, pid));
      for (const auto& line : stack) lines.push_back("stall:   | " + line);
    }
    const std::lock_guard lock(mailbox->mutex);
    if (mailbox->io != nullptr)
      asio::post(*mailbox->io, [done = std::move(done), lines = std::move(lines)]() mutable { done(std::move(lines)); });
  }).detach();
}

void StallWatch::close() {
  stop();
  const std::lock_guard lock(mailbox_->mutex);
  mailbox_->io = nullptr;
}

std::string StallWatch::status_text(LiveAttempt* attempt) {
  std::string out = fmt::format("idist-run {} on {}: ", ::getpid(), host_);
  if (attempt == nullptr) return out + "waiting for the job's nodes to meet\n";
  const auto running = std::chrono::duration<double>(detail::WallClock::now() - attempt->record.start).count();
  out += fmt::format("attempt {}, {} rank{} here, running {:.1f} s\n", attempt->record.index, attempt->ranks.size(),
                     attempt->ranks.size() == 1 ? "" : "s", running);
  // views() reads (and dates) the recorders: the same reading the periodic check does.
  for (const auto& line : detail::status_table(views(*attempt), common::recorder::now_ns()))
    out += line + "\n";
  if (options_.coordinator) out += "(this node's ranks: each node's idist-run answers for its own)\n";
  return out;
}

std::string StallWatch::job_views(LiveAttempt* attempt) {
  if (attempt == nullptr) return "[]";
  return detail::views_to_json(views(*attempt), common::recorder::now_ns(), host_, detail::kViewsBudget);
}

}  // namespace idist::launchers::supervision
