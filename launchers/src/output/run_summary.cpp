#include "run_summary.hpp"

#include <sys/wait.h>

#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "idist/common/duration.hpp"

namespace idist::launchers::detail {

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  std::string text = "was killed by " + signal_name(WTERMSIG(status));
  if (WCOREDUMP(status)) text += " (core dumped)";
  return text;
}

std::string describe(const RankRecord& rank) {
  if (!rank.status) return "is still running";
  if (rank.frozen_for)
    return describe(*rank.status) + " (idist-run stopped it: frozen, no heartbeat for " +
           common::measured_duration_text(*rank.frozen_for) + ")";
  return describe(*rank.status) + (rank.oom_killed ? " (the kernel's OOM killer: out of memory)" : "");
}

bool succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::string iso8601(WallClock::time_point time) {
  using namespace std::chrono;
  const auto since = time.time_since_epoch();
  const std::time_t seconds = duration_cast<std::chrono::seconds>(since).count();
  const auto millis = duration_cast<milliseconds>(since).count() % 1000;
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[40];
  const auto n = std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text + n, sizeof(text) - n, ".%03dZ", static_cast<int>(millis));
  return text;
}

std::string collateral_list(const AttemptRecord& attempt) {
  std::string list;
  for (const auto& r : attempt.ranks)
    if (r.collateral) list += (list.empty() ? "" : ", ") + std::to_string(r.rank);
  return list.empty() ? std::string() : "; stopped rank(s) " + list;
}

namespace {

using json = nlohmann::ordered_json;

json rank_json(const RankRecord& r, const std::string& host, bool first_failure) {
  json out;
  out["rank"] = r.rank;
  out["pid"] = r.pid;
  out["host"] = host;
  // Exactly one of exit_code and signal is set once the rank has ended.
  const bool exited = r.status && WIFEXITED(*r.status);
  const bool signaled = r.status && WIFSIGNALED(*r.status);
  out["exit_code"] = exited ? json(WEXITSTATUS(*r.status)) : json(nullptr);
  out["signal"] = signaled ? json(signal_name(WTERMSIG(*r.status))) : json(nullptr);
  out["core_dumped"] = signaled && WCOREDUMP(*r.status);
  out["oom_killed"] = r.oom_killed;
  out["frozen_s"] = r.frozen_for ? json(r.frozen_for->count()) : json(nullptr);
  out["start"] = iso8601(r.start);
  out["end"] = r.status ? json(iso8601(r.end)) : json(nullptr);
  out["collateral"] = r.collateral;
  out["first_failure"] = first_failure;
  out["log_bytes_lost"] = {{"out", r.out_log_lost}, {"err", r.err_log_lost}};
  return out;
}

}  // namespace

std::string summary_json(const RunRecord& run) {
  json out;
  out["run_id"] = run.run_id;
  out["host"] = run.host;
  out["exit_code"] = run.exit_code;
  out["outcome"] = run.outcome;
  out["log_bytes_lost"] = run.log_bytes_lost;
  out["console_dropped"] = {{"stdout", {{"lines", run.stdout_dropped.lines}, {"bytes", run.stdout_dropped.bytes}}},
                            {"stderr", {{"lines", run.stderr_dropped.lines}, {"bytes", run.stderr_dropped.bytes}}}};
  out["attempts"] = json::array();
  for (const auto& a : run.attempts) {
    json attempt;
    attempt["attempt"] = a.index;
    attempt["master_port"] = a.master_port;
    attempt["start"] = iso8601(a.start);
    attempt["end"] = iso8601(a.end);
    attempt["first_failure"] = a.first_failure ? json(a.ranks[*a.first_failure].rank) : json(nullptr);
    if (a.node_rank >= 0) attempt["node_rank"] = a.node_rank;
    if (!a.ended_by.empty()) attempt["ended_by"] = a.ended_by;
    if (!a.stall.empty()) attempt["stall"] = a.stall;
    if (!a.stragglers.empty()) attempt["stragglers"] = a.stragglers;
    if (a.stalled_rank) attempt["stalled_rank"] = *a.stalled_rank;
    if (!a.reforms.empty()) attempt["reforms"] = a.reforms;
    if (!a.reform_seconds.empty()) {
      attempt["reform_seconds"] = json::array();
      for (std::size_t i = 0; i < a.reforms.size(); ++i) {
        const auto s = a.reform_seconds.find(i);
        attempt["reform_seconds"].push_back(s == a.reform_seconds.end() ? json(nullptr) : json(s->second));
      }
    }
    attempt["ranks"] = json::array();
    for (std::size_t i = 0; i < a.ranks.size(); ++i)
      if (a.ranks[i].pid > 0) attempt["ranks"].push_back(rank_json(a.ranks[i], run.host, a.first_failure == i));
    out["attempts"].push_back(std::move(attempt));
  }
  return out.dump(2) + "\n";
}

}  // namespace idist::launchers::detail
