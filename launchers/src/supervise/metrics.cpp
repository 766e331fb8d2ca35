#include "metrics.hpp"

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "idist/env_contract.hpp"
#include "process_tree.hpp"
#include "rank_process.hpp"

namespace idist::launchers::supervision {
namespace {

namespace asio = boost::asio;
namespace rec = common::recorder;

// A label's value as the format wants it: backslash, double quote and newline escaped.
std::string escaped(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

std::string backend_label(std::size_t b) {
  return b < std::size(env::kBackendNames) ? std::string(env::kBackendNames[b]) : "other";
}

// What /proc says of a process: cpu seconds (user and system; with `children`, also of its
// children that ended and were waited for), resident bytes, state. `state` "ended" where it is
// gone.
struct ProcFigures {
  double cpu_seconds = 0;
  std::uint64_t resident_bytes = 0;
  std::string state = "ended";
};

ProcFigures proc_figures(pid_t pid, bool children) {
  ProcFigures f;
  if (pid <= 0) return f;
  const auto fields = detail::proc_stat_fields(pid);  // utime is field 14, at 11
  if (fields.size() < 22) return f;
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  static const long page = ::sysconf(_SC_PAGESIZE);
  auto ticks_used = std::stoull(fields[11]) + std::stoull(fields[12]);
  if (children) ticks_used += std::stoull(fields[13]) + std::stoull(fields[14]);
  f.cpu_seconds = static_cast<double>(ticks_used) / static_cast<double>(ticks);
  f.resident_bytes = std::stoull(fields[21]) * static_cast<std::uint64_t>(page);
  switch (fields[0].empty() ? '?' : fields[0][0]) {
    case 'R': f.state = "running"; break;
    case 'S': case 'I': f.state = "sleeping"; break;
    case 'D': f.state = "disk"; break;
    case 'T': case 't': f.state = "stopped"; break;
    case 'Z': case 'X': f.state = "ended"; break;
    default: f.state = "other";
  }
  return f;
}

// One op on one backend, summed over the rank's rings.
struct OpSum {
  std::uint64_t calls = 0, bytes = 0, ns = 0;
  std::array<std::uint64_t, rec::kBuckets> buckets{};
};

// The exposition: each metric's HELP and TYPE once, then its samples, rank by rank.
class Exposition {
 public:
  explicit Exposition(const JobFigures& job)
      : base_(fmt::format("job=\"{}\",node=\"{}\",host=\"{}\"", escaped(job.job), job.node, escaped(job.host))) {}
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, const std::string& labels, double value) {
    out_ += fmt::format("{}{{{}{}{}}} {}\n", name, base_, labels.empty() ? "" : ",", labels, value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string base_;
  std::string out_;
};

using OpTable = std::array<std::array<OpSum, rec::kOps>, rec::kStatBackends>;

OpTable op_table(const rec::Segment& s) {
  OpTable t{};
  for (const auto& ring : s.stats)
    for (std::size_t b = 0; b < rec::kStatBackends; ++b)
      for (std::size_t o = 0; o < rec::kOps; ++o) {
        const auto& st = ring.ops[b][o];
        auto& sum = t[b][o];
        sum.calls += st.calls.load(std::memory_order_relaxed);
        sum.bytes += st.bytes.load(std::memory_order_relaxed);
        sum.ns += st.ns.load(std::memory_order_relaxed);
        for (std::size_t k = 0; k < rec::kBuckets; ++k) sum.buckets[k] += st.buckets[k].load(std::memory_order_relaxed);
      }
  return t;
}

void collective_families(Exposition& e, const std::vector<RankFigures>& ranks) {
  std::vector<OpTable> tables;
  for (const auto& r : ranks) tables.push_back(r.segment ? op_table(*r.segment) : OpTable{});
  // Each family whole before the next: the format wants a metric's samples together.
  const auto each = [&](auto&& emit) {
    for (std::size_t i = 0; i < ranks.size(); ++i)
      for (std::size_t b = 0; b < rec::kStatBackends; ++b)
        for (std::size_t o = 1; o < rec::kOps; ++o)
          if (const auto& sum = tables[i][b][o]; sum.calls > 0)
            emit(fmt::format("rank=\"{}\",op=\"{}\",backend=\"{}\"", ranks[i].rank, rec::kOpNames[o], backend_label(b)),
                 sum);
  };
  e.family("idist_collective_calls_total", "counter", "Calls the rank made, by op and backend.");
  each([&](const std::string& l, const OpSum& s) { e.sample("idist_collective_calls_total", l, static_cast<double>(s.calls)); });
  e.family("idist_collective_bytes_total", "counter", "Bytes the rank's calls passed, by op and backend.");
  each([&](const std::string& l, const OpSum& s) { e.sample("idist_collective_bytes_total", l, static_cast<double>(s.bytes)); });
  e.family("idist_collective_seconds", "histogram",
           "Time in calls; calls under 10 us are timed one in 256, each timed one counting 256 times.");
  each([&](const std::string& l, const OpSum& s) {
    std::uint64_t cumulative = 0;
    for (std::size_t k = 0; k < rec::kBuckets; ++k) {
      cumulative += s.buckets[k];
      const auto le = k + 1 < rec::kBuckets ? fmt::format("{}", static_cast<double>(rec::kBucketBoundNs[k]) / 1e9) : "+Inf";
      e.sample("idist_collective_seconds_bucket", l + ",le=\"" + le + "\"", static_cast<double>(cumulative));
    }
    e.sample("idist_collective_seconds_sum", l, static_cast<double>(s.ns) / 1e9);
    e.sample("idist_collective_seconds_count", l, static_cast<double>(cumulative));
  });
}

void rank_families(Exposition& e, const std::vector<RankFigures>& ranks) {
  std::vector<ProcFigures> procs;
  for (const auto& r : ranks) {
    if (!r.running) {  // reaped: its pid may be another process's now
      procs.emplace_back();
      continue;
    }
    // The rank's process with the children it waited for, and the program where a script runs it.
    auto f = proc_figures(r.pid, true);
    if (r.program != r.pid && f.state != "ended") {
      const auto program = proc_figures(r.program, false);
      f.cpu_seconds += program.cpu_seconds;
      f.resident_bytes = program.resident_bytes;
      if (program.state != "ended") f.state = program.state;
    }
    procs.push_back(f);
  }
  const auto rank = [](const RankFigures& r) { return fmt::format("rank=\"{}\"", r.rank); };
  e.family("idist_between_collectives_seconds", "summary",
           "The rank's own work: time from the end of a timed call to the start of the next.");
  for (const auto& r : ranks) {
    std::uint64_t gaps = 0, ns = 0;
    if (r.segment)
      for (const auto& ring : r.segment->stats) {
        gaps += ring.work.gaps.load(std::memory_order_relaxed);
        ns += ring.work.gap_ns.load(std::memory_order_relaxed);
      }
    e.sample("idist_between_collectives_seconds_sum", rank(r), static_cast<double>(ns) / 1e9);
    e.sample("idist_between_collectives_seconds_count", rank(r), static_cast<double>(gaps));
  }
  e.family("idist_step_seconds", "summary", "The program's steps (auto_model's backward, or idist::mark_step()).");
  for (const auto& r : ranks) {
    const auto* st = r.segment ? &r.segment->steps : nullptr;
    e.sample("idist_step_seconds_sum", rank(r), st ? static_cast<double>(st->step_ns.load()) / 1e9 : 0);
    e.sample("idist_step_seconds_count", rank(r), st ? static_cast<double>(st->steps.load()) : 0);
  }
  e.family("idist_last_step_seconds", "gauge", "The rank's latest step.");
  for (const auto& r : ranks)
    e.sample("idist_last_step_seconds", rank(r), r.segment ? static_cast<double>(r.segment->steps.last_step_ns.load()) / 1e9 : 0);
  // Not for a rank that ended: its series ends (a 0 would be a counter going backwards).
  e.family("idist_rank_cpu_seconds_total", "counter", "The rank's cpu time, user and system.");
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (procs[i].state != "ended") e.sample("idist_rank_cpu_seconds_total", rank(ranks[i]), procs[i].cpu_seconds);
  e.family("idist_rank_resident_bytes", "gauge", "The rank's program's resident memory.");
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (procs[i].state != "ended")
      e.sample("idist_rank_resident_bytes", rank(ranks[i]), static_cast<double>(procs[i].resident_bytes));
  e.family("idist_rank_state", "gauge", "1 for the rank's process's state (running, sleeping, disk, stopped, ended).");
  for (std::size_t i = 0; i < ranks.size(); ++i)
    e.sample("idist_rank_state", rank(ranks[i]) + ",state=\"" + procs[i].state + "\"", 1);
}

void job_families(Exposition& e, const JobFigures& job) {
  e.family("idist_job_attempt", "gauge", "The attempt running (0: the first).");
  e.sample("idist_job_attempt", "", job.attempt);
  e.family("idist_job_restarts_total", "counter", "Attempts started after the first (--max-restarts).");
  e.sample("idist_job_restarts_total", "", job.restarts);
  e.family("idist_job_world_size", "gauge", "Ranks in the job.");
  e.sample("idist_job_world_size", "", job.world);
  e.family("idist_straggler", "gauge",
           "A rank named a straggler and not back under the threshold: how much longer its work is (0.23: 23%).");
  for (const auto& [rank, excess] : job.stragglers) e.sample("idist_straggler", fmt::format("rank=\"{}\"", rank), excess);
  e.family("idist_job_reforms_total", "counter",
           "Re-forms of the job in its processes (live recovery): losses gone on from, ranks admitted.");
  e.sample("idist_job_reforms_total", "", static_cast<double>(job.reforms));
}

// The world a re-form left: its record's line ends "world 4 -> 3" (recovery.cpp says so).
int world_after(const std::string& reform) {
  const auto at = reform.rfind("-> ");
  return at == std::string::npos ? 0 : std::atoi(reform.c_str() + at + 3);
}

int world_of(const ProcessSpec& spec) {
  for (const auto& e : spec.env)
    if (e.starts_with("WORLD_SIZE=")) return std::atoi(e.c_str() + 11);
  return 0;
}

void read_attempt(const LiveAttempt& attempt, JobFigures& job, std::vector<RankFigures>& ranks) {
  job.world = attempt.ranks.empty() ? 0 : world_of(*attempt.ranks.front().spec);
  if (!attempt.record.reforms.empty()) job.world = world_after(attempt.record.reforms.back());
  for (const auto& r : attempt.ranks) {
    if (r.record->pid <= 0) continue;  // a replacement has a rank of its own: no two share one
    ranks.push_back({.rank = r.spec->rank,
                     .pid = r.record->pid,
                     .program = r.recorder ? r.recorder->recording(r.record->pid) : r.record->pid,
                     .running = r.running(),
                     .segment = r.recorder ? &r.recorder->segment() : nullptr});
  }
}

}  // namespace

std::string metrics_text(const std::vector<std::unique_ptr<LiveAttempt>>& attempts, bool running, JobFigures job) {
  std::vector<RankFigures> ranks;
  for (const auto& a : attempts) {
    job.reforms += a->record.reforms.size();
    if (a->record.node_rank >= 0) job.node = a->record.node_rank;  // kept while the next attempt's nodes meet
  }
  if (!attempts.empty()) job.attempt = attempts.back()->record.index;
  if (running && !attempts.empty()) read_attempt(*attempts.back(), job, ranks);
  return prometheus_text(job, ranks);
}

std::string prometheus_text(const JobFigures& job, const std::vector<RankFigures>& ranks) {
  Exposition e(job);
  job_families(e, job);
  rank_families(e, ranks);
  collective_families(e, ranks);
  return e.take();
}

}  // namespace idist::launchers::supervision
