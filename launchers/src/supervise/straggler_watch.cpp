#include "straggler_watch.hpp"

#include <fstream>
#include <sstream>

#include "process_tree.hpp"
#include "rank_process.hpp"

namespace idist::launchers::supervision {

namespace {

// Often enough to name a straggler within a few steps of 100 ms, rarely enough that /proc's
// files (four a rank) cost nothing: a millisecond more a rank.
std::chrono::milliseconds read_every(std::size_t ranks) {
  return std::chrono::milliseconds(100 + static_cast<long>(ranks));
}

// How often a node shares its samples where the rendezvous compares: a step of 100 ms is
// still named within a few steps, and a hundred nodes send 400 small messages a second.
constexpr auto kShareEvery = std::chrono::milliseconds(250);

// /proc/PID/schedstat: ns on a cpu, ns waiting on a run queue.
void read_schedstat(pid_t pid, detail::WorkSample& s) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/schedstat");
  in >> s.run_ns >> s.wait_ns;
}

// /proc/PID/stat's major faults (field 12).
void read_faults(pid_t pid, detail::WorkSample& s) {
  if (const auto f = detail::proc_stat_fields(pid); f.size() > 9) s.major_faults = std::strtoull(f[9].c_str(), nullptr, 10);
}

// The process's cgroup's cpu.stat (v2), "" where it has none.
std::string cpu_stat_path(pid_t pid) {
  std::ifstream cgroup("/proc/" + std::to_string(pid) + "/cgroup");
  for (std::string line; std::getline(cgroup, line);)
    if (line.starts_with("0::")) return "/sys/fs/cgroup" + line.substr(3) + "/cpu.stat";
  return "";
}

// The throttled time of the process's cgroup (cpu.stat's throttled_usec), where cpu.max limits it.
void read_throttled(const std::string& cpu_stat, detail::WorkSample& s) {
  if (cpu_stat.empty()) return;
  std::ifstream stat(cpu_stat);
  std::string key;
  std::uint64_t value = 0;
  while (stat >> key >> value)
    if (key == "throttled_usec") s.throttled_us = value;
}

// The steps and the work at the last one, as one mark left them (StepStats::version).
void read_steps(const common::recorder::StepStats& st, detail::WorkSample& s) {
  for (int tries = 0; tries < 100; ++tries) {
    const auto v = st.version.load(std::memory_order_acquire);
    s.steps = st.steps.load(std::memory_order_relaxed);
    s.step_work_ns = st.work_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((v & 1) == 0 && st.version.load(std::memory_order_relaxed) == v) return;
  }
}

}  // namespace

StragglerWatch::StragglerWatch(asio::io_context& io, double threshold, std::string host)
    : timer_(io), threshold_(threshold), host_(std::move(host)), detector_({.threshold = threshold}) {}

void StragglerWatch::start(std::function<LiveAttempt*()> watched, std::function<void(const std::string&)> say) {
  if (threshold_ <= 0) return;
  watched_ = std::move(watched);
  say_ = std::move(say);
  check();
}

void StragglerWatch::stop() {
  stopped_ = true;
  timer_.cancel();
}

std::vector<detail::WorkSample> StragglerWatch::read(const LiveAttempt& attempt) {
  std::vector<detail::WorkSample> out;
  std::map<pid_t, std::string> cgroups;  // this reading's processes: the others' entries go
  for (const auto& r : attempt.ranks) {
    if (!r.running() || !r.recorder) continue;
    const auto& seg = r.recorder->segment();
    const pid_t pid = r.recorder->recording(r.record->pid);
    detail::WorkSample s{.rank = r.spec->rank, .pid = pid, .host = host_};
    read_steps(seg.steps, s);
    for (const auto& ring : seg.stats) {
      s.gaps += ring.work.gaps.load(std::memory_order_relaxed);
      s.gap_ns += ring.work.gap_ns.load(std::memory_order_relaxed);
    }
    read_schedstat(pid, s);
    read_faults(pid, s);
    // A process's cgroup, read once: a rank that moves to another (rare) keeps the first one's figures.
    auto known = cpu_stats_.find(pid);
    if (known == cpu_stats_.end()) known = cpu_stats_.emplace(pid, cpu_stat_path(pid)).first;
    read_throttled(known->second, s);
    cgroups.insert(*known);
    out.push_back(std::move(s));
  }
  cpu_stats_ = std::move(cgroups);
  return out;
}

void StragglerWatch::check() {
  if (stopped_) return;
  const LiveAttempt* attempt = watched_();
  if (attempt != nullptr && job_wide_ && job_wide_()) {
    if (const auto now = std::chrono::steady_clock::now(); now >= next_share_) {
      next_share_ = now + kShareEvery;
      share_(detail::samples_to_json(read(*attempt)));
    }
  } else if (attempt != nullptr) {
    for (const auto& line : detector_.observe(read(*attempt))) say_(line);
  }
  timer_.expires_after(read_every(attempt != nullptr ? attempt->ranks.size() : 0));
  timer_.async_wait([this](auto ec) {
    if (!ec) check();
  });
}

}  // namespace idist::launchers::supervision
