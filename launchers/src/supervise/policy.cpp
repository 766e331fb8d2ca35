#include "policy.hpp"

#include <signal.h>
#include <spdlog/fmt/fmt.h>
#include <sys/wait.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string_view>

#include "idist/launchers/supervisor.hpp"

namespace idist::launchers::supervision {

Blame blame_of(const detail::RankRecord& r) {
  if (!r.status || detail::succeeded(*r.status) || r.collateral) return Blame::none;
  if (!WIFSIGNALED(*r.status)) return Blame::consequence;
  switch (WTERMSIG(*r.status)) {
    case SIGKILL: case SIGSEGV: case SIGBUS: case SIGILL: case SIGFPE: return Blame::root_cause;
    default: return Blame::consequence;
  }
}

std::optional<int> lost_peer(const std::vector<std::string>& lines) {
  static constexpr std::string_view kWords = "connection to rank ";
  for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
    const auto at = line->find(kWords);
    if (at == std::string::npos) continue;
    const char* digits = line->c_str() + at + kWords.size();
    char* end = nullptr;
    const long peer = std::strtol(digits, &end, 10);
    if (end != digits && std::string_view(end).starts_with(" lost") && peer >= 0 && peer <= INT_MAX)
      return static_cast<int>(peer);
  }
  return std::nullopt;
}

LocalNext after_local_attempt(bool failed, Stop stop, int index, int max_restarts) {
  LocalNext next;
  next.restart = failed && stop == Stop::none && index < max_restarts;
  if (next.restart)
    next.then = fmt::format("; restarting every rank (attempt {} of at most {})", index + 1, max_restarts + 1);
  else if (failed && max_restarts > 0 && stop == Stop::none)
    next.then = fmt::format("; no restarts left (--max-restarts {})", max_restarts);
  return next;
}

std::string verdict_then(const RemoteVerdict& v, Stop stop, int max_restarts) {
  using Then = RemoteVerdict::Then;
  if (v.then == Then::restart)
    return fmt::format("; restarting every node (attempt {}, {} restart{} left)", v.next_attempt, v.restarts_left,
                       v.restarts_left == 1 ? "" : "s");
  if (v.then != Then::failure || stop != Stop::none) return "";
  // Said only where it is why: a job whose nodes fell below MIN ends whatever its budget.
  if (v.ended_by == RemoteVerdict::End::too_few_nodes) return "; the job ends: too few nodes left for another attempt";
  if (v.ended_by == RemoteVerdict::End::restarts_spent && max_restarts > 0)
    return fmt::format("; the job ends: no restart left (--max-restarts {})", max_restarts);
  return "; the job ends";
}

namespace {

std::string seconds_text(const std::optional<std::chrono::milliseconds>& timeout) {
  return fmt::format("{:g}s", timeout ? static_cast<double>(timeout->count()) / 1000 : 0.0);
}

// "succeeded on attempt 2 after 1 restart and 1 re-form": re-forms of an elastic job are free
// and must not read as restarts spent.
std::string success_warning(const OutcomeFacts& f) {
  if (f.restarts == 0 && f.reforms == 0) return "";
  std::vector<std::string> parts;
  if (f.restarts > 0) parts.push_back(fmt::format("{} restart{}", f.restarts, f.restarts == 1 ? "" : "s"));
  if (f.reforms > 0) parts.push_back(fmt::format("{} re-form{} (not counted as restarts)", f.reforms, f.reforms == 1 ? "" : "s"));
  return fmt::format("succeeded on attempt {} after {}", f.last->index, fmt::join(parts, " and "));
}

}  // namespace

Outcome decide_outcome(const OutcomeFacts& f, const std::string& stopped) {
  const detail::AttemptRecord& last = *f.last;
  Outcome o;
  if (f.job_failure && f.stop == Stop::none) {
    // The job's verdict, the same on every node: its first failure, wherever it was.
    o.exit_code = f.job_failure->exit_code;
    o.outcome = f.job_failure->cause;
    o.first_failure_is_the_jobs = last.first_failure.has_value();
    o.error = "the job failed: " + o.outcome;
  } else if (f.stop == Stop::coordination) {
    o.exit_code = f.job_failure ? f.job_failure->exit_code : 1;
    o.outcome = f.coordination_error;
    o.error = o.outcome + stopped;
  } else if (last.first_failure) {
    const auto& r = last.ranks[*last.first_failure];
    o.exit_code = detail::exit_code_of(*r.status);
    o.outcome = "rank " + std::to_string(r.rank) + " " + detail::describe(r);
    o.first_failure_is_the_jobs = true;
    if (f.stop == Stop::timed_out) o.error = "timed out after " + seconds_text(f.timeout) + " while stopping the ranks";
  } else if (last.stalled_rank && f.stop == Stop::none) {
    o.exit_code = kStallExit;
    o.outcome = fmt::format("stalled (--stall-action kill): {}",
                            last.stall.empty() ? "see the report" : last.stall.front().substr(std::string_view("stall: ").size()));
    o.error = fmt::format("exit status {}: the job stalled and was stopped{}", kStallExit, stopped);
  } else if (f.stop == Stop::timed_out) {
    o.exit_code = kTimeoutExit;
    o.outcome = "timed out after " + seconds_text(f.timeout);
    o.error = o.outcome + stopped;
  } else if (f.stop == Stop::interrupted) {
    o.exit_code = 128 + f.interrupted_by.value_or(SIGTERM);
    o.outcome = "interrupted by " + detail::signal_name(f.interrupted_by.value_or(SIGTERM));
    o.error = o.outcome + stopped;
  } else if (f.stop == Stop::spawn_error) {
    o.exit_code = 1;
    o.outcome = "could not start every rank";
  } else if (f.mismatched) {
    // Every rank exited 0, but at least one collective was called differently by different
    // ranks: some results are wrong. The exit status must say so.
    o.exit_code = 1;
    o.outcome = "every rank exited 0, but their collectives did not match (see the mismatch lines): results are wrong";
    o.error = "exit status 1: " + o.outcome;
  } else {
    o.outcome = "succeeded";
    o.warning = success_warning(f);
    // Live recovery: the job went on without a rank, which the last line must not hide.
    if (!last.reforms.empty()) {
      o.outcome = fmt::format("succeeded after {} re-form{} ({})", last.reforms.size(),
                              last.reforms.size() == 1 ? "" : "s", fmt::join(last.reforms, "; "));
      if (o.warning.empty()) o.warning = o.outcome;
    }
  }
  return o;
}

}  // namespace idist::launchers::supervision

namespace idist::launchers::supervision {

std::size_t follow_lost_connections(const std::vector<detail::RankRecord>& ranks,
                                    const std::vector<std::vector<std::string>>& tails, std::size_t first) {
  std::vector<bool> visited(ranks.size());
  std::size_t blamed = first;
  for (;;) {
    visited[blamed] = true;
    const auto peer = lost_peer(tails[blamed]);
    if (!peer) return blamed;
    const auto cause = std::find_if(ranks.begin(), ranks.end(),
                                    [&](const detail::RankRecord& r) { return r.rank == *peer && blame_of(r) != Blame::none; });
    if (cause == ranks.end() || visited[static_cast<std::size_t>(cause - ranks.begin())]) return blamed;
    spdlog::debug("rank {} lost its connection to rank {}, which failed on its own: blaming rank {}", ranks[blamed].rank,
                  *peer, *peer);
    blamed = static_cast<std::size_t>(cause - ranks.begin());
  }
}

}  // namespace idist::launchers::supervision
